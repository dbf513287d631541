"""How the after-the-run commands (`python -m rlpipe.eval`, `python -m rlpipe.report`) stop on
SIGINT or SIGTERM: one line naming the signal and its exit code (128 + n), never a
KeyboardInterrupt traceback, and nothing half-written (their files take their names only once
whole: rlpipe.files.atomic_write, the eval's films). SIGTERM is made an interrupt like SIGINT,
a KeyboardInterrupt (a BaseException: an env's own `except Exception` does not take it for a
fault of the env) that carries the signal's number."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

STOPS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(signum)


@contextmanager
def stops_as_interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt(signum) inside; the handlers before, after."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOPS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def say_stopped(prog: str, exc: KeyboardInterrupt, what_stays: str) -> int:
    """The one line for a stopped command; returns its exit code."""
    signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
    print(
        f"{prog}: stopped by {signal.Signals(signum).name} before it finished: {what_stays}",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum
