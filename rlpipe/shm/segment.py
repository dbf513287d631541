"""POSIX shared-memory segments under /dev/shm: create, attach, unlink, sweep.

Segments are plain files in /dev/shm opened with os.open + mmap, not
multiprocessing.shared_memory: Python 3.11's SharedMemory registers every attach with the
resource tracker, which then unlinks (and warns about) segments it does not own. Here the
driver alone creates and unlinks; workers only map.

Every page is allocated when the segment is made (posix_fallocate) and mapped in at once
(MAP_POPULATE), by the driver and by the worker alike. A sparse segment fills in as it is used:
the error log as errors arrive, a final-obs row at an env's first time limit, so /dev/shm and
both processes' RSS crept up for hours and read as a leak. Allocated up front, they start at
their bound and stay there, and a /dev/shm too small for the board fails at start-up with a
clear error instead of a SIGBUS in the middle of a run.

Names are `rlpipe_<run_id>_<part>` with run_id = `<driver pid>-<random hex>` (a torchrun rank's
driver appends `r<rank>`), so a sweep can tell a dead run's leftovers (owner pid gone) from a
live run's segments.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import secrets
import shutil
from pathlib import Path

import numpy as np

from rlpipe.procs import pid_alive
from rlpipe.spec import ConfigError

SHM_DIR = Path("/dev/shm")
PREFIX = "rlpipe_"
_NAME_RE = re.compile(r"^rlpipe_(\d+)-[0-9a-f]+(?:r\d+)?_")
log = logging.getLogger(__name__)
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere pages fault in


class SharedMemoryFull(ConfigError):
    """/dev/shm cannot hold a segment the run needs: env_count is too large for this machine's
    /dev/shm, reported like any value the engine cannot run with (exit 2)."""

    what = "shared memory"


def new_run_id(rank: int | None = None) -> str:
    """`<pid>-<hex>`, with `r<rank>` under torchrun: segment names, Redis keys (shared by all
    ranks with an external redis.url) and socket dirs are then namespaced per rank."""
    return f"{os.getpid()}-{secrets.token_hex(3)}" + (f"r{rank}" if rank is not None else "")


def segment_name(run_id: str, part: str) -> str:
    return f"{PREFIX}{run_id}_{part}"


class Segment:
    """One mapped segment. `buf` is the writable mmap; `base` its address for native code."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool):
        self.name = name
        self.buf = mm
        self.size = len(mm)
        self.owner = owner
        self._u8 = np.frombuffer(mm, dtype=np.uint8)
        self.base = self._u8.ctypes.data

    @classmethod
    def create(cls, name: str, size: int) -> "Segment":
        fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask (it can only take bits away)
            os.ftruncate(fd, size)
            _allocate(fd, name, size)
            mm = mmap.mmap(fd, size, flags=_MAP_FLAGS)
        except BaseException:
            os.close(fd)
            os.unlink(SHM_DIR / name)
            raise
        os.close(fd)
        return cls(name, mm, owner=True)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        fd = os.open(SHM_DIR / name, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size, flags=_MAP_FLAGS)
        finally:
            os.close(fd)
        return cls(name, mm, owner=False)

    def unlink(self) -> None:
        """Remove the name; mappings stay valid until closed (a replaced worker's included)."""
        try:
            os.unlink(SHM_DIR / self.name)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Unmap. Views into the buffer must be dropped first; if any survive, the mapping
        is left to the garbage collector rather than raising."""
        self._u8 = None
        try:
            self.buf.close()
        except BufferError:
            pass


def _allocate(fd: int, name: str, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        free_mb = shutil.disk_usage(SHM_DIR).free / 2**20
        raise SharedMemoryFull(
            f"{SHM_DIR} cannot hold the shared-memory segment {name} ({size / 2**20:.1f} MiB; "
            f"{free_mb:.1f} MiB free there). The obs board needs env_count x the obs bytes of "
            "its types x 2 slots, plus 1 MiB of error log per worker: give /dev/shm more room "
            "(docker run --shm-size, or mount -o remount,size=... /dev/shm), or lower env_count."
        ) from None


def sweep_dead_segments() -> list[str]:
    """Unlink rlpipe segments whose owner (driver) pid is gone; leave live runs' alone."""
    removed = []
    for path in SHM_DIR.glob(PREFIX + "*"):
        match = _NAME_RE.match(path.name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    if removed:
        log.info("swept %d shared-memory segment(s) left by dead runs", len(removed))
    return removed


def run_segments(run_id: str) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{PREFIX}{run_id}_*"))
