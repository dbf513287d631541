"""An env's fault as data: what `info["rlpipe_fault"]` says about an env whose step was cut.

The worker cuts the episode of an env that raised, broke the contract or ran past the step
deadline (truncated, with no finished-episode length: rlpipe/worker/envtable.py `CUT`), rebuilds
it by id and writes an ERROR record to its error log. The vector reads those records here: the
run's error aggregator (rlpipe/supervisor/errors.py, which still counts them for
errors_top10.md) keeps each record by env id as it pulls, until the vector reports it.
A worker writes its records just after it rings, so a cut row's record may be a moment behind
the ring: `take` pulls again for a short while before saying the record is missing.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

from rlpipe.supervisor.errors import ErrorAggregator

RECORD_WAIT_S = 0.2  # how long a cut row waits for its worker's record
KINDS = {"StepTimeout": "hang", "ContractViolation": "contract"}  # else "crash"
WORKER_RESTART = {
    "kind": "worker_restart",
    "error_type": "",
    "fingerprint": "",
    "message": "the env's worker process died or fell silent and was replaced; the env was rebuilt",
}


def fault_info(record: dict | None) -> dict:
    """`info["rlpipe_fault"]` of one env: kind (crash | contract | hang | worker_restart |
    unknown), error_type, fingerprint (the stack-trace hash the error report groups by), message."""
    if record is None:
        return {
            "kind": "unknown",
            "error_type": "",
            "fingerprint": "",
            "message": "the worker cut this env's step; its error record was not found",
        }
    error_type = str(record.get("error_type") or "")
    return {
        "kind": KINDS.get(error_type, "crash"),
        "error_type": error_type,
        "fingerprint": str(record.get("stacktrace_hash") or ""),
        "message": str(record.get("message") or ""),
    }


class FaultRecords(ErrorAggregator):
    """The run's error aggregator, also keeping each record by env id for the vector."""

    def __init__(self, run_dir: Path, interval_s: float):
        super().__init__(run_dir, interval_s)
        self.by_env: dict[int, collections.deque] = collections.defaultdict(collections.deque)

    def _count(self, rec: dict, worker_id) -> None:
        super()._count(rec, worker_id)
        env_id = rec.get("env_id")
        if isinstance(env_id, int):
            self.by_env[env_id].append(rec)

    def take(self, env_id: int, worker_id: int) -> dict | None:
        """The first record of `env_id` not reported yet (later ones of the same cut step, a
        rebuild that failed before one that worked, are dropped with it)."""
        deadline = time.monotonic() + RECORD_WAIT_S
        while True:
            self.drain(worker_id)
            queue = self.by_env.get(env_id)
            if queue:
                rec = queue.popleft()
                queue.clear()
                return rec
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)

    def forget(self, env_ids) -> None:
        """Records of envs that start afresh (a reset, a replaced worker): not a step's fault."""
        for worker_id in list(self._logs):
            self.drain(worker_id)
        for env_id in env_ids:
            self.by_env.pop(int(env_id), None)
