"""A full disk is a documented outcome, not a crash (issue 49): a write of the run that fails
for space (the lifecycle db, a checkpoint, TensorBoard, the error report, summary.json) stops
the run on purpose with `EXIT_DISK_FULL`, says in one line what was full, keeps the last good
checkpoint (a checkpoint is renamed in only once whole: rlpipe.files.atomic_write) and writes
`summary.json` where it still can, else says on stderr why it could not. No traceback: once the
disk is full, the log file's handler would print one per record, so logging's own error
report is turned off.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rlpipe.files import space_error, what_was_full

EXIT_DISK_FULL = 5
RESERVE_FILE = ".disk_reserve"  # space held at start, given back to write the summary
RESERVE_BYTES = 128 * 1024  # summary.json and the health report's text, with room to spare
log = logging.getLogger("rlpipe")


def disk_full_reason(exc: BaseException) -> str | None:
    """What was full, in words, when `exc` is a failure for space; None otherwise."""
    if space_error(exc) is None:
        return None
    logging.raiseExceptions = False  # the run's log file is on the full disk too
    return what_was_full(exc)


def hold_reserve(run_dir: Path) -> None:
    """Set `RESERVE_BYTES` aside in the run dir at start, so that a run stopped by a full
    disk can still write its summary (`end_disk_full` gives it back first). A disk already
    too full for it is left as it is: the run will stop on its first write."""
    path = run_dir / RESERVE_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError:
        path.unlink(missing_ok=True)


def release_reserve(run_dir: Path) -> None:
    (run_dir / RESERVE_FILE).unlink(missing_ok=True)


def end_disk_full(reason: str, checkpoints: list[Path], write_summary: Callable[[], None] | None) -> int:
    """After the teardown of a run stopped by a full disk: the summary where it can be
    written (None: the run stopped before it had one), one line on stderr, the exit code."""
    note = "" if write_summary else "; summary.json not written: the run stopped during its start-up"
    try:
        if write_summary is not None:
            write_summary()
    except Exception as exc:  # said in the one line; a traceback would bury it
        full = space_error(exc) is not None
        note = f"; summary.json not written: {'no space left' if full else f'{type(exc).__name__}: {exc}'}"
    last = f"last good checkpoint {checkpoints[-1]}" if checkpoints else "no checkpoint was written"
    print(
        f"rlpipe: disk full: no space left to write {reason}; the run stopped (exit {EXIT_DISK_FULL}), {last}{note}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_DISK_FULL
