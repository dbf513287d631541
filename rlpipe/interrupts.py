"""How the after-the-run commands (`python -m rlpipe.eval`, `python -m rlpipe.report`) stop on
SIGINT or SIGTERM: one line naming the signal, exit code 128 + n, no traceback, nothing
half-written.

The stop happens in the signal's handler: it removes what this process had half-written in
the command's output folder (the temporary files of rlpipe.files.atomic_write, a film not yet
renamed: both carry this process's pid in their names), says its line and leaves with
os._exit. Not by raising a KeyboardInterrupt where the signal lands: one that cut `import
torch` short (a CI run) made torch's teardown abort (SIGABRT and a native stack dump), and any
library's own `except` or `finally` may act on one half-way through its work. Everything those
commands write takes its name only once whole, so what is left is whole: theirs, or an
earlier run's.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlpipe.files import own_partial_files

STOPS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stops_at_once(prog: str, out_dir: Path, what_stays: str) -> Iterator[None]:
    """Inside, SIGINT and SIGTERM end the process as the module's docstring says (`out_dir`:
    where the command writes); the handlers before, after."""

    def stop(signum: int, _frame) -> None:
        for path in own_partial_files(out_dir):
            path.unlink(missing_ok=True)
        print(
            f"{prog}: stopped by {signal.Signals(signum).name} before it finished: {what_stays}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOPS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
