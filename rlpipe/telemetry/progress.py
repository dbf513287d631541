"""The live view of a run in the user's terminal.

On a terminal: a rich panel, at most 80 columns wide, redrawn in place: a bar toward the
run's stop condition (env steps or duration, whichever comes first, with its ETA), the
counters (steps, sps, updates, faults, memory, envs active/dormant/quarantined) and every env
type's return (mean of its last 100 episodes) with an arrow for its trend over the last
~30 s. Log lines of the run print above the panel, not through it.

Anywhere else (a pipe, a file, CI): one plain line every `interval_s`.

`quiet_console_logs` keeps other libraries' INFO lines (TensorBoard's "Directory watcher
advancing ..." when the health report reads the event files) out of the terminal: they still
go to the run's log file.
"""

from __future__ import annotations

import collections
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

WIDTH = 80  # the panel never grows past this
INNER = WIDTH - 4  # inside the border and padding
MAX_NAME_W, VALUE_W = 16, 7  # a longer type name is cut with an ellipsis
TREND_WINDOW_S = 30.0
FAULTS_EVERY_S = 10.0
CONSOLE_LOGGERS = ("rlpipe", "hydra", "__main__")  # below WARNING, only these reach the terminal


@dataclass(frozen=True)
class Status:
    """What the driver knows at one refresh."""

    stage: str | None
    elapsed_s: float
    env_steps: int
    sps: float
    updates: int
    env_count: int
    active: int  # envs whose slice rang within the last few seconds
    dormant: int  # envs of worker groups not woken yet
    memory_mb: float | None  # PSS of the whole run, last sample
    returns: dict[str, float | None]  # type -> mean of its last 100 episodes (None: none yet)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _value(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.1f}" if abs(v) >= 1 else f"{v:.2f}"


class Progress:
    def __init__(
        self,
        interval_s: float,
        total_env_steps: int | None = None,
        duration_s: float | None = None,
        lifecycle_db: Path | None = None,
    ):
        self.interval_s = interval_s
        self.total_env_steps = total_env_steps
        self.duration_s = duration_s
        self.lifecycle_db = lifecycle_db
        self.tty = sys.stdout.isatty()
        self._live: Live | None = None
        self._next_plain = 0.0
        self._history: dict[str, collections.deque] = {}
        self._faults: dict[str, int] | None = None
        self._next_faults = 0.0
        self._swapped: list[tuple[logging.StreamHandler, object]] = []

    # -- where the run stands ----------------------------------------------------------------
    def fraction(self, st: Status) -> float:
        parts = []
        if self.total_env_steps:
            parts.append(st.env_steps / self.total_env_steps)
        if self.duration_s:
            parts.append(st.elapsed_s / self.duration_s)
        return min(1.0, max(parts)) if parts else 0.0

    def eta_s(self, st: Status) -> float | None:
        """Seconds to whichever stop condition comes first at the current rate."""
        left = []
        if self.total_env_steps and st.sps > 0:
            left.append(max(0, self.total_env_steps - st.env_steps) / st.sps)
        if self.duration_s:
            left.append(self.duration_s - st.elapsed_s)
        return min(left) if left else None

    def trend(self, name: str, value: float, now: float) -> str:
        """↑, ↓ or → against the value about TREND_WINDOW_S ago (1 % of its size is noise)."""
        h = self._history.setdefault(name, collections.deque())
        h.append((now, value))
        while len(h) > 1 and now - h[1][0] >= TREND_WINDOW_S:
            h.popleft()
        ref = h[0][1]
        if abs(value - ref) <= 0.01 * max(abs(ref), 1e-9):
            return "→"
        return "↑" if value > ref else "↓"

    def faults(self) -> dict[str, int] | None:
        """Fault counts from the lifecycle log, read at most every FAULTS_EVERY_S."""
        now = time.monotonic()
        if self.lifecycle_db is not None and now >= self._next_faults:
            self._next_faults = now + FAULTS_EVERY_S
            try:
                from rlpipe.lifecycle import fault_counts

                self._faults = fault_counts(self.lifecycle_db)
            except Exception:  # not written yet, or busy: keep the last counts
                pass
        return self._faults

    # -- rendering ---------------------------------------------------------------------------
    def _stop_text(self) -> str:
        parts = []
        if self.total_env_steps:
            parts.append(f"{self.total_env_steps:,} steps")
        if self.duration_s:
            parts.append(_clock(self.duration_s))
        return " or ".join(parts)

    def plain(self, st: Status, trends: dict[str, str] | None = None) -> str:
        f = self.faults()
        faults = "-" if f is None else f"{_total_faults(f)}"
        rets = " ".join(f"{k}={_value(v)}{(trends or {}).get(k, '')}" for k, v in st.returns.items())
        return (
            f"rlpipe {st.stage or 'run'} | {100 * self.fraction(st):3.0f}% | {st.elapsed_s:5.0f}s, "
            f"ETA {_clock(self.eta_s(st))} | envs {st.active}/{st.env_count} active, {st.dormant} "
            f"dormant | steps {st.env_steps:,} | sps {st.sps:,.0f} | updates {st.updates} | "
            f"faults {faults} | mem {_mem(st.memory_mb)} | return {rets or '-'}"
        )

    def panel(self, st: Status) -> Panel:
        now = time.monotonic()
        frac = self.fraction(st)
        head = Table.grid(padding=(0, 1))
        head.add_column(no_wrap=True)
        head.add_column(no_wrap=True)
        head.add_row(
            ProgressBar(total=1.0, completed=frac, width=34),
            Text(f"{100 * frac:3.0f}%  {_clock(st.elapsed_s)}  ETA {_clock(self.eta_s(st))}"),
        )
        f = self.faults()
        quarantined = "?" if f is None else f"{f.get('quarantined', 0):,}"
        counters = Text(
            f"steps {st.env_steps:,}  sps {st.sps:,.0f}  updates {st.updates:,}  "
            f"faults {'?' if f is None else f'{_total_faults(f):,}'}  mem {_mem(st.memory_mb)}",
            no_wrap=True,
            overflow="ellipsis",
        )
        envs = Text(
            f"envs {st.active:,} active · {st.dormant:,} dormant · {quarantined} quarantined of {st.env_count:,}",
            no_wrap=True,
            overflow="ellipsis",
        )
        lines = [head, counters, envs]
        if st.returns:
            lines.append(Text("return, last 100 episodes (trend over 30 s; -: no episode yet):", style="dim"))
            # As many columns as fit whole names (up to MAX_NAME_W): three for short names,
            # two for the seed12 mix's longest ("mountaincar_cont").
            name_w = min(MAX_NAME_W, max(len(n) for n in st.returns))
            cell_w = name_w + VALUE_W + 3
            cols = max(1, (INNER + 2) // (cell_w + 2))
            cells = []
            for name, v in st.returns.items():
                arrow = " " if v is None else self.trend(name, v, now)
                cell = Text(f"{_fit(name, name_w):<{name_w}} {_value(v):>{VALUE_W}} ")
                cell.append(arrow, style={"↑": "green", "↓": "red"}.get(arrow, "dim"))
                cells.append(cell)
            for i in range(0, len(cells), cols):
                lines.append(Text("  ").join(cells[i : i + cols]))
        return Panel(
            Group(*lines),
            title=f"rlpipe {st.stage or 'run'} → {self._stop_text()}",
            title_align="left",
            width=WIDTH,
            padding=(0, 1),
        )

    # -- the context -------------------------------------------------------------------------
    def __enter__(self):
        if self.tty:
            console = Console()
            self._live = Live(
                Text("rlpipe: starting"),
                console=console,
                refresh_per_second=4,
                transient=True,
                redirect_stdout=True,
                redirect_stderr=True,
            )
            self._live.__enter__()
            self._route_logs_through_live()
        return self

    def _route_logs_through_live(self) -> None:
        """Console log handlers hold the real stdout/stderr; while the panel is drawn they
        write through rich's proxies, so a log line lands above the panel instead of in it."""
        real = {id(sys.__stdout__): sys.stdout, id(sys.__stderr__): sys.stderr}
        for h in logging.getLogger().handlers:
            if type(h) is logging.StreamHandler and id(h.stream) in real:
                self._swapped.append((h, h.setStream(real[id(h.stream)])))

    def update(self, status: Status) -> None:
        if self._live is not None:
            self._live.update(self.panel(status))
            return
        now = time.monotonic()
        trends = {k: self.trend(k, v, now) for k, v in status.returns.items() if v is not None}
        if now >= self._next_plain:
            self._next_plain = now + self.interval_s
            print(self.plain(status, trends), flush=True)

    def __exit__(self, *exc):
        for h, stream in self._swapped:
            h.setStream(stream)
        self._swapped = []
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None


def _fit(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _mem(mb: float | None) -> str:
    return "-" if not mb else f"{mb:,.0f} MiB"


def _total_faults(f: dict[str, int]) -> int:
    """Crashes, hangs, quarantines and worker restarts (rebuilds follow from the first three)."""
    return sum(f.get(k, 0) for k in ("env_crashes", "env_hangs", "quarantined", "worker_restarts"))


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name.split(".")[0] in CONSOLE_LOGGERS


def quiet_console_logs() -> None:
    """Other libraries' records below WARNING stay off the terminal handlers (the run's log
    file still gets them). Idempotent: a multirun calls it once per job."""
    for h in logging.getLogger().handlers:
        if type(h) is logging.StreamHandler and not any(isinstance(f, _ConsoleFilter) for f in h.filters):
            h.addFilter(_ConsoleFilter())
