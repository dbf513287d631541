"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The content goes to a temporary file in the same directory (so the rename stays on one file
system), is flushed and fsynced, and is then renamed over the target with os.replace; the
directory is fsynced after, so the rename itself survives a crash. The temporary name holds
the writer's pid and thread, so two writers never share one, and a failed write removes it.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Union

Content = Union[str, bytes, Callable[[BinaryIO], None]]


def temp_name(path: Path) -> Path:
    """The temporary file `atomic_write` writes before the rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def partial_name(path: Path) -> Path:
    """Where a file written in pieces over a while (a film) stands until whole: its suffix kept
    (a writer may choose the format by it), this process's pid in its name."""
    return path.with_name(f"{path.stem}.partial-{os.getpid()}{path.suffix}")


def own_partial_files(directory: Path) -> list[Path]:
    """This process's temporary and partial files in `directory` (and its subfolders): what a
    stop must remove, another process's left alone."""
    pid = os.getpid()
    return [*directory.rglob(f".*.{pid}.*.tmp"), *directory.rglob(f"*.partial-{pid}.*")]


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable; a file system that cannot is left as it is."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, content: Content, mode: int = 0o666) -> Path:
    """Write `content` (text as UTF-8, bytes, or a function that writes into a binary file)
    to `path` atomically; returns the path. `mode` is the new file's (less the umask), set
    as it is created: 0o600 keeps it its owner's from the first byte."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


PRIVATE_UMASK = 0o077


def make_private(run_dir: Path) -> None:
    """The run dir and what is already in it (Hydra's config copies and log file) for its
    owner only, and everything this process and its children create from now on too (umask
    077: files 0600, dirs 0700). A run dir holds the checkpoints, the config, the lifecycle
    db and Redis's socket: nothing another local user should read."""
    os.umask(PRIVATE_UMASK)
    run_dir.chmod(0o700)
    for root, dirs, files in os.walk(run_dir):
        for name in dirs:
            Path(root, name).chmod(0o700)
        for name in files:
            p = Path(root, name)
            if not p.is_symlink():
                p.chmod(0o600)


SQLITE_FULL = 13  # sqlite3's "database or disk is full" (sqlite3.Error.sqlite_errorcode)


class DiskFull(OSError):
    """A write of the run failed for space; `what` names the file (a checkpoint, the
    lifecycle db...). Raised from the original error."""

    def __init__(self, what: str):
        super().__init__(errno.ENOSPC, f"no space left to write {what}")
        self.what = what


def space_error(exc: BaseException | None) -> BaseException | None:
    """The error in `exc`'s chain (itself, its causes and contexts) that says a file system
    is full (ENOSPC, a quota: EDQUOT, sqlite's SQLITE_FULL); None when none does."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull) or getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL:
            return exc
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def what_was_full(exc: BaseException) -> str:
    """What `exc` (a space error in its chain) failed to write, in words."""
    cur, seen = exc, set()
    while cur is not None and id(cur) not in seen:  # the most specific name first
        seen.add(id(cur))
        if isinstance(cur, DiskFull):
            return cur.what
        cur = cur.__cause__ or cur.__context__
    err = space_error(exc)
    if isinstance(err, OSError) and err.filename:
        return str(err.filename)
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
