"""Checkpoints: atomic save, keep-last-k, resume from the newest loadable one, RNG states.

Files are `<dir>/ckpt_<step:012d>.pt`, written with `rlpipe.files.atomic_write` (a temp file
named after the writer's pid and thread, fsynced, renamed, the directory fsynced): a reader
sees a whole checkpoint or none; a temp file whose writer died is removed by the next save. After a save, all but the
newest `keep` checkpoints are deleted.

Loading uses `torch.load(weights_only=True)`, so a payload is made of tensors, dicts, lists,
tuples, str, int, float, bool, None and bytes (the venv's torch loads bytes, e.g. a
RewardNormalizer.state(), and ints beyond int64; the tests check it; RNG states below are
stored as tensors and strings so they do not depend on it). No numpy arrays: convert them
with torch.from_numpy.

`load_latest` tries the checkpoints newest first; one that cannot be read (truncated, not a
torch file, not an rlpipe checkpoint, another format version) or that `validate` rejects is
logged, renamed to `<name>.bad` (so later saves and pruning never count it as the newest) and
the next older one is tried. When every file fails, CheckpointError names each file and why.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rlpipe.files import DiskFull, atomic_write, space_error
from rlpipe.learner.device import to_host
from rlpipe.procs import pid_alive
from rlpipe.spec import ConfigError

log = logging.getLogger(__name__)

FORMAT = "rlpipe-checkpoint"
VERSION = 1
_NAME = re.compile(r"^ckpt_(\d{12})\.pt$")
_TMP = re.compile(r"^\.ckpt_\d+\.pt\.(\d+)\.\d+\.tmp$")  # rlpipe.files.temp_name: pid, thread


class CheckpointError(ConfigError):
    """No checkpoint could be loaded; the message names every file tried and why it failed.
    A user-input error like a bad config value: one paragraph, exit code 2."""

    what = "checkpoint error"


def checkpoint_files(directory: str | os.PathLike) -> list[Path]:
    """The directory's checkpoints, oldest first (by step in the name)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def save_checkpoint(directory: str | os.PathLike, step: int, payload: dict, keep: int) -> Path:
    """Write `payload` atomically as ckpt_<step>.pt, then keep only the newest `keep` files.
    Returns the checkpoint's path. A checkpoint of the same step is replaced."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    if keep < 1:
        raise ValueError(f"learner.keep_checkpoints must be >= 1, got {keep}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"ckpt_{step:012d}.pt"
    # Temp files left by a dead writer (killed mid-save) are garbage.
    for p in d.iterdir():
        m = _TMP.match(p.name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            p.unlink(missing_ok=True)
    record = {"format": FORMAT, "version": VERSION, "step": int(step), "payload": to_host(payload)}
    try:
        atomic_write(final, lambda f: torch.save(record, f), mode=0o600)  # weights: the owner's alone
    except Exception as exc:  # the older checkpoints stay: the new one was never renamed in
        if space_error(exc) is not None:
            raise DiskFull(f"checkpoint {final}") from exc
        raise
    for old in checkpoint_files(d)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Read one checkpoint and return its payload; CheckpointError naming the file when it is
    unreadable or not a compatible rlpipe checkpoint."""
    path = Path(path)
    try:
        record = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # truncated/corrupt zip, pickle errors, disallowed globals, I/O
        raise CheckpointError(f"checkpoint {path} is unreadable: {unreadable_reason(path, exc)}") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not an rlpipe checkpoint")
    if record.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {record.get('version')!r}; this rlpipe reads version {VERSION}"
        )
    if not isinstance(record.get("payload"), dict):
        raise CheckpointError(f"checkpoint {path} has no payload")
    return record["payload"]


ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


def unreadable_reason(path: Path, exc: Exception) -> str:
    """Why torch.load refused a file, in rlpipe's words. torch's own message for a refused
    pickle advises loading it again with weights_only=False, which runs whatever code the file
    holds: never the advice for a file that did not load as what rlpipe writes."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}"
    try:
        with open(path, "rb") as f:
            head = f.read(len(ZIP_MAGIC))
    except OSError as err:
        return f"{err.strerror or err}"
    if head != ZIP_MAGIC:
        return "not a checkpoint file (torch.save writes a zip archive; this file is not one)"
    text = str(exc)
    blocked = re.search(r"GLOBAL ([\w.]+)", text)
    if blocked:
        return (
            f"it holds an object rlpipe never writes ({blocked.group(1)}): not written by rlpipe, or altered "
            f"since; it is not loaded"
        )
    if "zip archive" in text or isinstance(exc, EOFError):
        return "truncated or corrupted (its zip archive is not whole)"
    first = text.splitlines()[0] if text else ""
    said = first if first and "weights_only" not in first else "refused by torch.load(weights_only=True)"
    return f"{type(exc).__name__}: {said}"


def load_latest(
    directory: str | os.PathLike,
    validate: Callable[[dict], None] | None = None,
    map_location="cpu",
    quarantine: bool = True,
) -> tuple[Path, dict] | None:
    """(path, payload) of the newest checkpoint that loads and passes `validate`; None when
    the directory holds no checkpoint. `validate(payload)` raises (any exception; its message
    is reported) to reject an incompatible payload (another model shape, env mix...). Failed
    files are skipped with a warning and, with quarantine, renamed to `<name>.bad`. When all
    fail: CheckpointError listing every file and its reason."""
    files = checkpoint_files(directory)
    if not files:
        return None
    failures = []
    for path in reversed(files):
        try:
            payload = load_checkpoint(path, map_location)
            if validate is not None:
                try:
                    validate(payload)
                except Exception as exc:
                    raise CheckpointError(
                        f"checkpoint {path} is incompatible with this run: {type(exc).__name__}: {exc}"
                    ) from exc
        except CheckpointError as exc:
            failures.append(str(exc))
            log.warning("%s; skipping it", exc)
            if quarantine:
                try:
                    os.replace(path, path.with_name(path.name + ".bad"))
                except OSError:
                    pass
            continue
        return path, payload
    raise CheckpointError(
        f"no loadable checkpoint in {Path(directory)} ({len(files)} tried, newest first):\n  " + "\n  ".join(failures)
    )


# -- RNG states ----------------------------------------------------------------------------------


def rng_state(
    numpy_generators: dict[str, np.random.Generator] | None = None,
    torch_generators: dict[str, torch.Generator] | None = None,
) -> dict:
    """Every RNG state as a weights_only-safe dict: python `random`, numpy's global RNG, torch
    CPU (and CUDA when available), plus named numpy Generators and torch Generators.
    numpy states are JSON strings (their 128-bit ints exceed int64)."""
    version, mt, gauss = random.getstate()
    np_global = np.random.get_state()
    state = {
        "python": {"version": int(version), "mt": torch.tensor(mt, dtype=torch.int64), "gauss_next": gauss},
        "numpy_global": {
            "name": str(np_global[0]),
            "keys": torch.from_numpy(np_global[1].astype(np.int64)),
            "pos": int(np_global[2]),
            "has_gauss": int(np_global[3]),
            "cached_gaussian": float(np_global[4]),
        },
        "torch": torch.get_rng_state(),
        "numpy": {
            k: json.dumps(g.bit_generator.state, default=_json_default) for k, g in (numpy_generators or {}).items()
        },
        "torch_generators": {k: g.get_state() for k, g in (torch_generators or {}).items()},
        # a CUDA generator's state is not a CPU one's (Philox offsets against a Mersenne
        # Twister): set_rng_state restores a stream only on the kind of device it was saved on
        "torch_generator_devices": {k: g.device.type for k, g in (torch_generators or {}).items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _json_default(o):
    if isinstance(o, np.ndarray):
        return {"__ndarray__": o.tolist(), "dtype": str(o.dtype)}
    if isinstance(o, np.integer):
        return int(o)
    raise TypeError(f"cannot store {type(o).__name__} in an RNG state")


def _json_hook(d):
    if "__ndarray__" in d:
        return np.asarray(d["__ndarray__"], dtype=d["dtype"])
    return d


def set_rng_state(
    state: dict,
    numpy_generators: dict[str, np.random.Generator] | None = None,
    torch_generators: dict[str, torch.Generator] | None = None,
) -> None:
    """Restore what `rng_state` saved into the global RNGs and the given named generators
    (a name missing from the state: KeyError naming it)."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["mt"].tolist()), py["gauss_next"]))
    ng = state["numpy_global"]
    np.random.set_state(
        (ng["name"], ng["keys"].numpy().astype(np.uint32), ng["pos"], ng["has_gauss"], ng["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        saved = state["cuda"]
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved)
        else:
            log.warning(
                "checkpoint has CUDA RNG states for %d devices, this machine has %d: CUDA RNGs not restored",
                len(saved),
                torch.cuda.device_count(),
            )
    for k, g in (numpy_generators or {}).items():
        if k not in state["numpy"]:
            raise KeyError(f"checkpoint RNG state has no numpy generator {k!r}")
        g.bit_generator.state = json.loads(state["numpy"][k], object_hook=_json_hook)
    saved_on = state.get("torch_generator_devices", {})
    for k, g in (torch_generators or {}).items():
        if k not in state["torch_generators"]:
            raise KeyError(f"checkpoint RNG state has no torch generator {k!r}")
        if saved_on.get(k, g.device.type) != g.device.type:
            log.warning(
                "checkpoint's %r generator was saved on %s, this run's is on %s: it keeps this run's seed",
                k,
                saved_on[k],
                g.device.type,
            )
            continue
        g.set_state(state["torch_generators"][k])
