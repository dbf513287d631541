"""Live progress: a status line refreshed in place on a terminal (rich), otherwise a plain
line every `interval_s` (logs and CI stay readable)."""
from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text


class Progress:
    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.tty = sys.stdout.isatty()
        self._live = None
        self._next_plain = 0.0

    def __enter__(self):
        if self.tty:
            self._live = Live(Text("rlpipe: starting"), console=Console(), refresh_per_second=4,
                              transient=True)
            self._live.__enter__()
        return self

    def update(self, line: str) -> None:
        if self._live is not None:
            self._live.update(Text(line))
            return
        now = time.monotonic()
        if now >= self._next_plain:
            self._next_plain = now + self.interval_s
            print(line, flush=True)

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
