"""Bad input said as one paragraph with exit 2, whoever finds it (docs/running.md, "Bad
input"): rlpipe's own checks raise ConfigError (rlpipe.config_checks); this module covers
what Hydra finds first, which Hydra would print as its own message and exit 1 (`explain`), and
the keys no setting has, which Hydra lets in with `+` (`check_known_keys`).

Where `+key=value` adds a key: only under the settings whose keys are names, not settings
(`OPEN_KEYS`): `env_mix.types` (an env type of the mix: `+env@env_mix.types.<name>=<type>`),
`env_mix.weights` (its weight) and `buffer.keys` (an obs key of the board, itself checked
against its schema), and the env nodes inside `env_mix.types` (their constructor's parameters,
checked by the env type). Anywhere else a key the schema (rlpipe/config.py) does not declare
is one nothing would read: an error, with the closest settings' names.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from rlpipe.spec import ConfigError

EXIT_CONFIG = 2  # bad input, whoever finds it (a supervisor need not try it again)
OPEN_KEYS = ("env_mix.types", "env_mix.weights", "buffer.keys")
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
LIST_ALL = "`python -m rlpipe --cfg job` prints every setting with its value"
_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def exit_with(text: str) -> None:
    """Bad input found where no caller turns a ConfigError into its paragraph (a Hydra callback:
    Hydra turns a callback's exception into a warning): said here, exit 2."""
    print(f"rlpipe: config error: {text}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG)


# -- keys nothing reads ------------------------------------------------------------------------


def check_known_keys(cfg: DictConfig, schema: type) -> None:
    """ConfigError naming the first key of the composed `cfg` that `schema` (a dataclass, the
    run's RunSpec) does not declare, outside the OPEN_KEYS."""
    unknown = _first_unknown(cfg, schema, "")
    if unknown is not None:
        key, known = unknown
        raise ConfigError(unknown_key_text(key, known))


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (through Optional), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    inner = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
    return inner[0] if len(inner) == 1 else None


def _first_unknown(node: Any, schema: Any, prefix: str) -> tuple[str, list[str]] | None:
    schema = _dataclass_of(schema)
    if schema is None or not isinstance(node, DictConfig):
        return None
    hints = typing.get_type_hints(schema)
    declared = [f.name for f in dataclasses.fields(schema) if f.init]
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in declared:
            return path, declared
        if path in OPEN_KEYS:
            continue
        found = _first_unknown(node[key] if not OmegaConf.is_missing(node, key) else None, hints[key], f"{path}.")
        if found is not None:
            return found
    return None


def unknown_key_text(key: str, known: list[str]) -> str:
    name = key.rsplit(".", 1)[-1]
    parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(f'`{parent}{c}`' for c in close)}?" if close else ""
    return (
        f"Unknown config key {key}: no setting of that name, so nothing would read it.{hint} "
        f"Settings are declared in rlpipe/config.py with their defaults in conf/ ({LIST_ALL}); "
        f"`+key=value` adds keys only under {', '.join(OPEN_KEYS)} (and an env type's node)."
    )


def schema_fields(schema: type, dotted: str) -> list[str]:
    """The settings declared at `dotted` (a section's path, '' for the top) of `schema`."""
    for part in filter(None, dotted.split(".")):
        schema = _dataclass_of(schema)
        schema = typing.get_type_hints(schema).get(part) if schema is not None else None
    schema = _dataclass_of(schema)
    if schema is None:
        return []
    return [f.name for f in dataclasses.fields(schema) if f.init]


# -- what Hydra found --------------------------------------------------------------------------


def explain(exc: BaseException, schema: type) -> str | None:
    """One paragraph for an error Hydra raised while it composed the config or made the run
    directory; None for anything else (a bug's traceback stays a traceback)."""
    from hydra.errors import CompactHydraException, MissingConfigException, OverrideParseException

    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, MissingConfigException):
        return _missing_option(exc)
    if isinstance(exc, OverrideParseException):
        return (
            f"rlpipe: config error: cannot read the override `{exc.override}`: {_first_line(exc)}. "
            f"An override is `key=value`, `group=option` or `+key=value` ({GRAMMAR})."
        )
    if isinstance(exc, CompactHydraException) and isinstance(cause, OmegaConfBaseException):
        return "rlpipe: config error: " + _omegaconf_text(cause, schema)
    if isinstance(exc, CompactHydraException):
        return f"rlpipe: config error: {' '.join(str(exc).split())}"
    if isinstance(exc, OSError) and exc.filename is not None:
        return (
            f"rlpipe: cannot create or write the run directory: {exc.strerror}: {exc.filename}. The run "
            f"directory is hydra.run.dir (hydra.sweep.dir with -m); give one this user may create "
            f"and write (e.g. `hydra.run.dir=runs/mine`)."
        )
    return None


def hydra_refusal(exc: BaseException, schema: type) -> str | None:
    """`explain`'s paragraph without its "rlpipe: config error: " (for a caller that names
    the job or the API first); None for anything Hydra did not refuse."""
    text = explain(exc, schema)
    return None if text is None else text.removeprefix("rlpipe: config error: ")


def _omegaconf_text(err: OmegaConfBaseException, schema: type) -> str:
    key = getattr(err, "full_key", None) or "?"
    if isinstance(err, (ConfigAttributeError, ConfigKeyError)):
        missing = re.match(r"Key '([^']+)'", str(err))
        if missing:  # "Key 'x' not in 'RunSpec'" or "Key 'obs' is not in struct" (a dict section)
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            if parent in OPEN_KEYS:
                return f"{parent} has no entry {missing.group(1)}; `+{key}=...` adds one."
            return unknown_key_text(key, schema_fields(schema, parent))
    if isinstance(err, ValidationError):
        value = re.match(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", str(err))
        if value:
            allowed = _TYPE_WORDS.get(value.group(2), value.group(2))
            return (
                f"Invalid config value {key}={value.group(1)!r}: allowed is {allowed}. "
                f"Fix it in conf/ or on the command line (e.g. `{key}=...`)."
            )
    return f"{key}: {_first_line(err)}."


def _missing_option(exc) -> str:
    found = re.search(r"Could not find '([^']+)'", str(exc))
    missing = exc.missing_cfg_file or (found.group(1) if found else "?")
    group, _, option = missing.rpartition("/")
    options = list(exc.options or [])
    if not options:
        listed = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", str(exc))
        options = listed.group(1).split() if listed else []
    close = difflib.get_close_matches(option, options, n=1, cutoff=0.6)
    hint = f" Did you mean `{group}={close[0]}`?" if close else ""
    allowed = f"allowed: {', '.join(options)}." if options else "it has no options here."
    return (
        f"rlpipe: config error: no option `{option}` in config group `{group}` (from `{group}={option}`); "
        f"{allowed}{hint} Each option is a file in conf/{group}/."
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].rstrip(".") if text else type(err).__name__
