"""One declaration per setting: conf/ holds every default, and every key in conf/ is read.

The schema dataclasses of rlpipe/config.py are what code reads; a default written there as
well as in conf/ would be a second declaration that can drift (a reader could not tell
which is live), and a key that no code reads is a setting that does nothing. The same holds
for the env nodes (conf/env/<type>.yaml, and the nodes and tunings of conf/env_mix and
conf/stage): they are the env types' constructor parameters, so a constructor (its `*Params`
dataclass, its `__init__` or `describe`) declares none of their values again. A node's
`learner:` is no constructor parameter: its keys are learner settings the type sets for
itself (rlpipe.config.TYPE_LEARNER_KEYS), each a LearnerSpec field read by code.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import typing
from pathlib import Path

from omegaconf import MISSING, DictConfig, OmegaConf

from conftest import REPO, compose_cfg
from rlpipe.config import TYPE_LEARNER_KEYS, TYPE_RUN_KEYS, LearnerSpec, RunSpec, conf_dir

# Schema defaults allowed, each for a key that not every option file sets.
ALLOWED_DEFAULTS = {
    "env_mix.id": "only env_mix=gym names a Gymnasium id",
    "env_mix.name": "only env_mix=gym names its type (after the id, or as given)",
    "buffer.keys.*.dtype": "the dtype of a buffer key added on the command line",
}
# Keys that code reads through a value rlpipe/config.py derives from them (the derived
# attribute must be read outside the config modules).
DERIVED = {
    "env_mix.types": "env_types",
    "env_mix.weights": "env_types",
    "env_mix.name": "env_types",
    "buffer.keys.*.shape": "obs_keys",
    "buffer.keys.*.dtype": "obs_keys",
}
# env_mix.types.<type>.* are the env types' constructor parameters, not schema fields: the
# schema walk below leaves them to the env-node tests at the end of this file.
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
            found = [
                c
                for n in found
                if isinstance(n, DictConfig)
                for c in (n.values() if part == "*" else [n[part]] if part in n else [])
            ]
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
        for file, value in _yaml_values(path) if "*" not in path else ():  # an entry sets its own
            if value != default:
                problems.append(f"{path}: schema default {default!r} but {file} sets {value!r}")
        if path not in ALLOWED_DEFAULTS:
            problems.append(f"{path}: schema default {default!r} duplicates conf/; make it MISSING")
    assert not problems, "\n".join(problems)


def _configs():
    yield []
    for group in sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name not in ("env", "hydra")):
        for option in sorted((conf_dir() / group).glob("*.yaml")):
            yield [f"+stage={option.stem}" if group == "stage" else f"{group}={option.stem}"] + (
                ["env_mix.id=CartPole-v1"] if option.stem == "gym" else []
            )


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
            names.update(
                n.attr
                for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
            )
    return names


def test_every_conf_key_is_read_by_code():
    fields, read = schema_fields(), attributes_read()
    interpolations = "\n".join(p.read_text() for p in conf_dir().rglob("*.yaml"))
    keys = {key for overrides in _configs() for key in conf_keys(compose_cfg(overrides), fields)}
    problems = [
        f"{key}: in conf/ but not a schema field" for key in sorted(keys) if key not in fields and key not in OPAQUE
    ]
    for key in sorted(keys):
        name = DERIVED.get(key, key.rpartition(".")[2])
        if name not in read and "${" + key + "}" not in interpolations:
            problems.append(f"{key}: set in conf/ but no code outside rlpipe/config*.py reads `.{name}`")
    assert not problems, "\n".join(problems)


# -- env nodes -------------------------------------------------------------------------------------

TYPE_LEARNER_NODE = "learner"  # an env node's per-type learner settings (taken out before construction)

# Constructor defaults allowed, each for a parameter that not every node of its type sets. Such a
# default says "left out" (None), never a value: a value belongs in the node.
ENV_ALLOWED_DEFAULTS = {
    "GymnasiumEnv.obs_key": "only an id whose flat obs should go to `vector` names it",
    "GymnasiumEnv.rgb_shape": "only image ids take the board's rgb shape",
    "GymnasiumEnv.make_kwargs": "only ids with gym.make arguments pass them",
    "GymnasiumEnv.wrappers": "only ids that need wrappers list them",
}
# The methods whose keyword parameters are an env node's keys (beside a `Params` dataclass).
ENV_METHODS = ("__init__", "describe", "preload")
EMPTY = inspect.Parameter.empty


def _plain(value):
    """A YAML value or a Python default in one form (tuples as lists), to compare them."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _target_class(target: str) -> type:
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def env_nodes():
    """(file, type name, class, node, defines) for every env node in conf/: the types'
    own nodes (conf/env/*.yaml), the nodes an env_mix option defines (defines=True: they carry
    `_target_`), and the tunings of env_mix options and stages (defines=False: keys set over
    conf/env/<name>.yaml's node). Values unresolved: an interpolation is no literal."""
    own = {}
    for file in sorted((conf_dir() / "env").glob("*.yaml")):
        node = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
        own[file.stem] = _target_class(node["_target_"])
        yield file.relative_to(REPO), file.stem, own[file.stem], node, True
    for group, path in (("env_mix", ("types",)), ("stage", ("env_mix", "types"))):
        for file in sorted((conf_dir() / group).glob("*.yaml")):
            types = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
            for part in path:
                types = types.get(part) or {} if isinstance(types, dict) else {}
            for name, node in types.items():
                if "_target_" in node:
                    yield file.relative_to(REPO), name, _target_class(node["_target_"]), node, True
                else:
                    assert name in own, (
                        f"{file.relative_to(REPO)} tunes env type {name!r}, which has no conf/env/{name}.yaml"
                    )
                    yield file.relative_to(REPO), name, own[name], node, False


def env_parameters(cls: type) -> dict[str, list[tuple[str, object]]]:
    """parameter -> [(where, default)] of an env type: the fields of its `Params` dataclass and
    the keyword parameters of its __init__, describe and preload (EMPTY: required)."""
    out: dict[str, list] = {}
    params = getattr(cls, "Params", None)
    if params is not None:
        for f in dataclasses.fields(params):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out.setdefault(f.name, []).append((params.__name__, EMPTY if default is dataclasses.MISSING else default))
    for method in ENV_METHODS:
        fn = getattr(cls, method, None)
        if fn is None or fn is getattr(object, method, None):
            continue
        for p in inspect.signature(fn).parameters.values():
            if p.name not in ("self", "env_id", "seed") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                out.setdefault(p.name, []).append((f"{cls.__name__}.{method}", p.default))
    return out


def _class_node(tree: ast.Module, name: str):
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def parameters_read(cls: type) -> set[str]:
    """The parameters an env type's code reads: attributes loaded in the modules of the class
    and its rlpipe bases outside its `Params` dataclass (whose checks are not reads), and
    names loaded inside the methods that take them as keywords."""
    params = getattr(cls, "Params", None)
    names = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("rlpipe."):
            continue
        tree = ast.parse(Path(sys.modules[klass.__module__].__file__).read_text())
        skip = (
            {id(n) for n in ast.walk(_class_node(tree, params.__name__))}
            if params is not None and _class_node(tree, params.__name__) is not None
            else set()
        )
        names.update(
            n.attr
            for n in ast.walk(tree)
            if id(n) not in skip and isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
        )
        body = _class_node(tree, klass.__name__)
        for fn in (n for n in (body.body if body else []) if isinstance(n, ast.FunctionDef) and n.name in ENV_METHODS):
            names.update(n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    return names


def test_env_constructor_defaults_live_in_conf_only():
    nodes = list(env_nodes())
    problems = []
    for cls in dict.fromkeys(c for _f, _n, c, _node, _d in nodes):
        defining = [f for f, _n, c, _node, d in nodes if c is cls and d]
        for name, declared in env_parameters(cls).items():
            label = f"{cls.__name__}.{name}"
            set_by = [(f, _plain(node[name])) for f, _n, c, node, _d in nodes if c is cls and name in node]
            for where, default in declared:
                if default is EMPTY:
                    continue
                for file, value in set_by:
                    if value == _plain(default):
                        problems.append(
                            f"{where}: {name}={default!r} duplicates {file}'s {name}: {value!r}; "
                            "make it required (no default)"
                        )
                    elif label not in ENV_ALLOWED_DEFAULTS:
                        problems.append(
                            f"{where}: {name}={default!r} but {file} sets {name}: {value!r}; "
                            "make it required (no default)"
                        )
                if label not in ENV_ALLOWED_DEFAULTS:
                    if not set_by:
                        problems.append(
                            f"{where}: {name}={default!r} is a setting no conf/ node sets; set it "
                            f"in the type's conf/env node and make it required"
                        )
                elif default is not None:
                    problems.append(
                        f"{where}: {name}={default!r}: an allowed default is None (left out), never a value"
                    )
                elif {f for f, _v in set_by} >= set(defining):
                    problems.append(f"{where}: {name} is set by every node of {cls.__name__}; make it required")
    assert not problems, "\n".join(problems)


def test_every_env_node_key_is_a_parameter_read_by_code():
    problems = []
    for file, name, cls, node, _defines in env_nodes():
        params, read = env_parameters(cls), parameters_read(cls)
        for key in node:
            if key in ("_target_", "_partial_", TYPE_LEARNER_NODE):
                continue
            if key not in params:
                problems.append(f"{file}: {name}.{key} is no parameter of {cls.__name__}")
            elif key not in read:
                problems.append(
                    f"{file}: {name}.{key} is set but no code of {cls.__name__} reads `.{key}` "
                    "(or the name in the method taking it)"
                )
    assert not problems, "\n".join(problems)


def test_env_node_learner_keys_are_per_type_learner_settings():
    """`learner:` in an env node sets LearnerSpec fields named in TYPE_LEARNER_KEYS, each read
    by code (as `.name`, like every learner setting); no env type takes a `learner` parameter
    of its own (the node key could not reach it)."""
    learner_fields, read = {f.name for f in dataclasses.fields(LearnerSpec)}, attributes_read()
    per_type = TYPE_LEARNER_KEYS + TYPE_RUN_KEYS
    problems = [f"TYPE_LEARNER_KEYS: {k} is no LearnerSpec field" for k in per_type if k not in learner_fields]
    problems += [
        f"TYPE_LEARNER_KEYS: {k} is read by no code outside rlpipe/config*.py" for k in per_type if k not in read
    ]
    for file, name, cls, node, _defines in env_nodes():
        if TYPE_LEARNER_NODE in env_parameters(cls):
            problems.append(f"{cls.__name__} takes a `{TYPE_LEARNER_NODE}` parameter, which the node key shadows")
        for key in node.get(TYPE_LEARNER_NODE) or {}:
            if key not in TYPE_LEARNER_KEYS + TYPE_RUN_KEYS:
                allowed = ", ".join(TYPE_LEARNER_KEYS + TYPE_RUN_KEYS)
                problems.append(f"{file}: {name}.learner.{key} is not one of {allowed}")
    assert not problems, "\n".join(problems)
