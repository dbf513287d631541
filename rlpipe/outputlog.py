"""A process's stdout and stderr (fd 1 and 2, so a C library's printf too) into a log file of
its own in the run dir, capped, never the driver's terminal (issue 49): an env that prints
100 KB a step wrote 2.8 GB to the driver's stdout in 20 s and cut the run's steps/s by 5.

The file is opened O_APPEND and shared by fd 1 and 2 (and by whatever the process starts,
which inherits them). When `check` finds it past `CAP_BYTES`, it cuts it back to its first
`HEAD_BYTES` (where the first traceback usually is) and appends a line that counts the bytes
dropped so far; the latest output follows. A file is at most CAP_BYTES plus what the process
writes between two checks (a worker checks at every beat: after each slice it steps, and while
a slow step runs).
"""

from __future__ import annotations

import os
import sys

CAP_BYTES = 4 * 2**20
HEAD_BYTES = 2**20


class OutputLog:
    def __init__(self, path: str, header: str):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.write(fd, f"--- {header} ---\n".encode())
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self.path = path
        self.dropped = 0

    def check(self) -> None:
        """Cut the file back when it has grown past the cap (see the module's docstring)."""
        size = os.fstat(1).st_size
        if size <= CAP_BYTES:
            return
        self.dropped += size - HEAD_BYTES
        note = (
            f"\n[rlpipe: {self.dropped} bytes of output dropped so far; this log keeps its first "
            f"{HEAD_BYTES} bytes and the latest, {CAP_BYTES} in all]\n"
        )
        try:
            os.ftruncate(1, HEAD_BYTES)
            os.write(1, note.encode())
        except OSError:
            pass  # a full disk: the driver stops the run on its own writes; this one may wait
