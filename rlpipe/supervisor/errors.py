"""The error aggregator: pulls every worker's error log, counts by stack-trace hash, and
keeps `errors_top10.md` in the run directory up to date (docs/architecture.md, Control plane).

The driver owns one ErrorAggregator. Each worker's error log (rlpipe.shm.errorlog, in the
worker's segment) is added when the worker starts and drained + removed when it is replaced
or stopped, so the last records of a dead worker are still counted. `maybe_run(now)` in the
driver's loop pulls and rewrites the report every `logging.aggregate_interval_s`; `finish()`
does a last pull and write at the end of the run. The report is rewritten atomically
(rlpipe/files.py), so a reader sees the old or the new report, never half of one.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rlpipe.files import atomic_write
from rlpipe.shm.errorlog import stacktrace_hash

log = logging.getLogger(__name__)

REPORT_NAME = "errors_top10.md"
TOP_N = 10
SAMPLE_LINES_TB = 40  # traceback lines kept per sample in the TensorBoard text


@dataclass
class HashStats:
    """Everything known about one stack-trace hash."""

    stacktrace_hash: str
    error_type: str
    count: int = 0
    first_ts: float = float("inf")
    last_ts: float = float("-inf")
    env_types: Counter = field(default_factory=Counter)
    env_ids: set = field(default_factory=set)
    workers: set = field(default_factory=set)
    message: str = ""
    traceback: str = ""
    truncated: bool = False

    def add(self, rec: dict, worker_id, ts: float) -> None:
        self.count += 1
        if ts < self.first_ts:
            self.first_ts = ts
            # the sample is the earliest occurrence's (or the first that carries a traceback)
            self.message = str(rec.get("message") or self.message)
            self.traceback = str(rec.get("traceback") or self.traceback)
        elif not self.traceback and rec.get("traceback"):
            self.traceback = str(rec["traceback"])
            self.message = self.message or str(rec.get("message") or "")
        self.last_ts = max(self.last_ts, ts)
        self.env_types[str(rec.get("env_type") or "?")] += 1
        env_id = rec.get("env_id")
        if env_id is not None:
            self.env_ids.add(env_id)
        self.workers.add(worker_id)
        self.truncated = self.truncated or bool(rec.get("truncated"))


class ErrorAggregator:
    """Counts the ERROR records of every worker's error log by stack-trace hash; writes the Top-10."""

    def __init__(self, run_dir: Path, interval_s: float, top_n: int = TOP_N, report_name: str = REPORT_NAME):
        self.run_dir = Path(run_dir)
        self.interval_s = float(interval_s)
        self.top_n = int(top_n)
        self.path = self.run_dir / report_name
        self._logs: dict = {}
        self._stats: dict[str, HashStats] = {}
        self._lock = threading.RLock()
        self._next_run = float("-inf")
        self.total = 0  # records counted
        self.pulls = 0
        self._dropped_retired = 0  # dropped / corrupt counts of error logs already removed
        self._corrupt_retired = 0
        self._read_errors = 0

    # -- error logs ----------------------------------------------------------------------

    def add_log(self, worker_id, elog) -> None:
        """Start pulling `elog` for `worker_id`; an older error log of the same id is drained and
        retired first (a replaced worker's successor brings a fresh one)."""
        with self._lock:
            if worker_id in self._logs:
                self.remove_log(worker_id)
            self._logs[worker_id] = elog

    def drain(self, worker_id) -> int:
        """Pull everything left in one worker's error log now; the number of records counted."""
        with self._lock:
            elog = self._logs.get(worker_id)
            return 0 if elog is None else self._pull_one(worker_id, elog)

    def remove_log(self, worker_id, drain: bool = True) -> int:
        """Stop pulling a worker's error log, draining it first (default): records counted."""
        with self._lock:
            elog = self._logs.get(worker_id)
            if elog is None:
                return 0
            n = self._pull_one(worker_id, elog) if drain else 0
            self._retire(elog)
            del self._logs[worker_id]
            return n

    def _retire(self, elog) -> None:
        try:
            self._dropped_retired += int(elog.dropped)
        except Exception:  # an error log whose memory is gone: its drops are unknown
            pass
        self._corrupt_retired += int(getattr(elog, "corrupt", 0))

    # -- pulling -------------------------------------------------------------------------

    def _pull_one(self, worker_id, elog) -> int:
        try:
            records = elog.read_all()
        except Exception as exc:  # never take the driver down over an error report
            self._read_errors += 1
            log.warning("error log of worker %s unreadable: %s", worker_id, exc)
            return 0
        for rec in records:
            self._count(rec, worker_id)
        return len(records)

    def _count(self, rec: dict, worker_id) -> None:
        h = rec.get("stacktrace_hash")
        if not isinstance(h, str) or not h:
            basis = rec.get("traceback") or f"{rec.get('error_type')}: {rec.get('message')}"
            h = stacktrace_hash(str(basis))
        try:
            ts = float(rec.get("ts"))
        except (TypeError, ValueError):
            ts = time.time()
        stats = self._stats.get(h)
        if stats is None:
            stats = self._stats[h] = HashStats(h, str(rec.get("error_type") or "?"))
        stats.add(rec, worker_id, ts)
        self.total += 1

    def add_record(self, rec: dict, worker_id) -> None:
        """A record the driver made itself (a worker's death in an env's step)."""
        with self._lock:
            self._count(rec, worker_id)

    def pull(self) -> int:
        """Read every error log; the number of new records counted."""
        with self._lock:
            self.pulls += 1
            return sum(self._pull_one(wid, elog) for wid, elog in list(self._logs.items()))

    def maybe_run(self, now: float | None = None) -> bool:
        """Pull and rewrite the report when interval_s has passed since the last time
        (monotonic clock; the first call always runs). True when it ran."""
        now = time.monotonic() if now is None else now
        if now < self._next_run:
            return False
        self._next_run = now + self.interval_s
        self.pull()
        self.write_report()
        return True

    def finish(self) -> Path:
        """The run's last pull and report (call after the workers stopped, before unlink)."""
        with self._lock:
            for wid in list(self._logs):
                self.drain(wid)
            return self.write_report()

    # -- results -------------------------------------------------------------------------

    def counts_by_hash(self) -> dict[str, int]:
        with self._lock:
            return {h: s.count for h, s in self._stats.items()}

    def top(self, n: int | None = None) -> list[HashStats]:
        """The `n` (default top_n) most frequent hashes, ties broken by first seen."""
        with self._lock:
            ranked = sorted(self._stats.values(), key=lambda s: (-s.count, s.first_ts, s.stacktrace_hash))
            return ranked[: self.top_n if n is None else n]

    @property
    def dropped(self) -> int:
        """Records the workers could not write because their error log was full."""
        with self._lock:
            live = 0
            for elog in self._logs.values():
                try:
                    live += int(elog.dropped)
                except Exception:
                    pass
            return self._dropped_retired + live

    @property
    def corrupt(self) -> int:
        with self._lock:
            return self._corrupt_retired + sum(int(getattr(r, "corrupt", 0)) for r in self._logs.values())

    def render(self, tensorboard: bool = False) -> str:
        """The report as markdown; `tensorboard=True` shortens the sample tracebacks."""
        with self._lock:
            top = self.top()
            distinct = len(self._stats)
            total, dropped, corrupt = self.total, self.dropped, self.corrupt
        lines = [f"# Errors: top {self.top_n} by stack-trace hash", ""]
        lines.append(
            f"Updated {_fmt_ts(time.time())} UTC. {total} error record(s), {distinct} distinct "
            f"stack trace(s), {dropped} dropped (error log full), {corrupt} unreadable."
        )
        lines.append("")
        if total == 0:
            lines.append("No errors were recorded.")
            lines.append("")
            return "\n".join(lines)
        lines += [
            "| # | stacktrace hash | count | error type | env types | envs | first seen (UTC) | last seen (UTC) |",
            "|--:|---|--:|---|---|--:|---|---|",
        ]
        for i, s in enumerate(top, 1):
            types = ", ".join(f"{t} ×{c}" for t, c in s.env_types.most_common())
            lines.append(
                f"| {i} | `{s.stacktrace_hash}` | {s.count} | {_cell(s.error_type)} | {_cell(types)} "
                f"| {len(s.env_ids)} | {_fmt_ts(s.first_ts)} | {_fmt_ts(s.last_ts)} |"
            )
        rest = distinct - len(top)
        if rest > 0:
            rest_count = total - sum(s.count for s in top)
            lines.append("")
            lines.append(f"{rest} more stack trace(s) outside the top {self.top_n}: {rest_count} record(s).")
        lines.append("")
        lines.append("## Samples")
        for i, s in enumerate(top, 1):
            lines.append("")
            lines.append(f"### {i}. `{s.stacktrace_hash}`: {s.error_type} ×{s.count}")
            lines.append("")
            if s.message:
                lines.append(f"Message: {_code_span(s.message)}")
                lines.append("")
            envs = sorted(s.env_ids, key=lambda e: (not isinstance(e, int), e if isinstance(e, int) else 0, str(e)))
            if envs:
                shown = ", ".join(str(e) for e in envs[:10]) + (", …" if len(envs) > 10 else "")
                lines.append(f"Envs ({len(envs)}): {shown}. Workers: {len(s.workers)}.")
                lines.append("")
            tb = s.traceback or "(no traceback recorded)"
            if tensorboard:
                tb_lines = tb.splitlines()
                if len(tb_lines) > SAMPLE_LINES_TB:
                    tb = "\n".join(["…"] + tb_lines[-SAMPLE_LINES_TB:])
            fence = "`" * max(3, _longest_backtick_run(tb) + 1)
            lines += [fence + "text", tb.rstrip("\n"), fence]
            if s.truncated:
                lines.append("")
                lines.append("(some records of this hash were truncated to fit the error log's record cap)")
        lines.append("")
        return "\n".join(lines)

    def text_for_tensorboard(self) -> str:
        """Markdown for TensorBoard's text plugin (`add_text`)."""
        return self.render(tensorboard=True)

    def write_report(self) -> Path:
        """Rewrite `errors_top10.md` atomically; its path."""
        text = self.render()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return atomic_write(self.path, text)


def _fmt_ts(ts: float) -> str:
    if not (ts == ts) or ts in (float("inf"), float("-inf")):
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _cell(text: str) -> str:
    return _inline(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<")


def _code_span(text: str) -> str:
    """`text` as one inline code span (markdown would otherwise eat `<Foo object at ...>`)."""
    text = _inline(text)
    ticks = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _inline(text: str) -> str:
    return " ".join(str(text).split())


def _longest_backtick_run(text: str) -> int:
    runs = re.findall(r"`+", text)
    return max((len(r) for r in runs), default=0)
