"""One declaration per setting: conf/ holds every default, and every key in conf/ is read.

The schema dataclasses of rlpipe/config.py are what code reads; a default written there as
well as in conf/ would be a second declaration that can drift (a reader could not tell
which is live), and a key that no code reads is a setting that does nothing.
"""
from __future__ import annotations

import ast
import dataclasses
import typing

from omegaconf import MISSING, DictConfig, OmegaConf

from conftest import REPO, compose_cfg
from rlpipe.config import RunSpec, conf_dir

# Schema defaults allowed, each for a key that not every option file sets.
ALLOWED_DEFAULTS = {
    "env_mix.id": "only env_mix=gym names a Gymnasium id",
    "env_mix.name": "only env_mix=gym names its type (after the id, or as given)",
    "buffer.keys.*.dtype": "the dtype of a buffer key added on the command line",
}
# Keys that code reads through a value rlpipe/config.py derives from them (the derived
# attribute must be read outside the config modules).
DERIVED = {"env_mix.types": "env_types", "env_mix.weights": "env_types", "env_mix.name": "env_types",
           "buffer.keys.*.shape": "obs_keys", "buffer.keys.*.dtype": "obs_keys"}
# env_mix.types.<type>.* are the env types' constructor parameters: Hydra instantiates each
# type's `_target_` with them, so they are not walked here (an unknown one fails there).
OPAQUE = {"env_mix.types"}
CONFIG_MODULES = {REPO / "rlpipe" / "config.py", REPO / "rlpipe" / "config_checks.py"}


def _entry_type(hint):
    """The dataclass of a `dict[str, Dataclass]` field (buffer.keys), else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1]
    return None


def schema_fields(cls=RunSpec, prefix=""):
    """key path -> dataclass field of every setting (a dict entry's fields under `*`)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path, hint = prefix + f.name, hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(schema_fields(hint, path + "."))
        elif _entry_type(hint) is not None:
            out.update(schema_fields(_entry_type(hint), path + ".*."))
        else:
            out[path] = f
    return out


def _yaml_values(path: str):
    """(file, value) for each option file of the key's group that sets it (stages excluded:
    they override, they are not defaults)."""
    group, _, rest = path.partition(".")
    files = [conf_dir() / "config.yaml"] if not rest else sorted((conf_dir() / group).glob("*.yaml"))
    for file in files:
        node = OmegaConf.load(file)
        parts = (rest or group).split(".")
        found = [node]
        for part in parts:
            found = [c for n in found if isinstance(n, DictConfig)
                     for c in (n.values() if part == "*" else [n[part]] if part in n else [])]
        for value in found:
            yield file.relative_to(REPO), OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def test_schema_defaults_live_in_conf_only():
    problems = []
    for path, f in schema_fields().items():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.append(f"{path}: no default at all; give it `= MISSING` (conf/ sets it)")
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if default == MISSING:
            continue
        for file, value in _yaml_values(path) if "*" not in path else ():   # an entry sets its own
            if value != default:
                problems.append(f"{path}: schema default {default!r} but {file} sets {value!r}")
        if path not in ALLOWED_DEFAULTS:
            problems.append(f"{path}: schema default {default!r} duplicates conf/; make it MISSING")
    assert not problems, "\n".join(problems)


def _configs():
    yield []
    for group in sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name not in ("env", "hydra")):
        for option in sorted((conf_dir() / group).glob("*.yaml")):
            yield [f"+stage={option.stem}" if group == "stage" else f"{group}={option.stem}"] + \
                (["env_mix.id=CartPole-v1"] if option.stem == "gym" else [])


def conf_keys(node: DictConfig, fields: dict, prefix=""):
    """Key paths set in a composed config, down to the schema's settings (a dict entry's
    keys under `*`)."""
    for key in node:
        path, child = prefix + str(key), node._get_node(key)
        if path in fields or path in OPAQUE or not isinstance(child, DictConfig) or child._is_none():
            yield path
        elif any(f.startswith(path + ".*.") for f in fields):
            for entry in child.values():
                yield from (f"{path}.*.{k}" for k in entry)
        else:
            yield from conf_keys(child, fields, path + ".")


def attributes_read() -> set[str]:
    """Attribute names loaded anywhere in rlpipe/ outside the schema and its checks (a value
    the schema only checks is not read)."""
    names = set()
    for path in sorted((REPO / "rlpipe").rglob("*.py")):
        if path not in CONFIG_MODULES:
            names.update(n.attr for n in ast.walk(ast.parse(path.read_text()))
                         if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load))
    return names


def test_every_conf_key_is_read_by_code():
    fields, read = schema_fields(), attributes_read()
    interpolations = "\n".join(p.read_text() for p in conf_dir().rglob("*.yaml"))
    keys = {key for overrides in _configs() for key in conf_keys(compose_cfg(overrides), fields)}
    problems = [f"{key}: in conf/ but not a schema field" for key in sorted(keys)
                if key not in fields and key not in OPAQUE]
    for key in sorted(keys):
        name = DERIVED.get(key, key.rpartition(".")[2])
        if name not in read and "${" + key + "}" not in interpolations:
            problems.append(f"{key}: set in conf/ but no code outside rlpipe/config*.py reads `.{name}`")
    assert not problems, "\n".join(problems)
