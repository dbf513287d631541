"""The env lifecycle log: one row per create, crash, rebuild, wake, worker restart, ... of a run.

Workers never touch SQLite. Each one holds a `LifecycleClient` (a ZMQ PUSH) and sends one
compact-JSON frame per event; the driver process runs the single `LifecycleWriter`, a thread
that drains a PULL socket plus an in-process queue (for the driver's own events) and writes
rows in batched transactions to `<run_dir>/lifecycle.sqlite` (WAL). One writer means no
lock contention between thousands of envs, and a worker can never be blocked by the log:
a full send queue drops the event and counts it.

Readers (`fault_counts`, `event_counts`, `env_history`, the recovery report, the CLI
`python -m rlpipe.lifecycle <run_dir>`) open the file read-only, so they are safe to use
while a run is still writing.

This package imports nothing else of rlpipe but rlpipe.chaos_faults (which imports nothing of
rlpipe; the recovery report reads each chaos fault's healing rule there): workers, the driver
and the reports all use it.
"""

from rlpipe.lifecycle.client import LifecycleClient
from rlpipe.lifecycle.events import DB_NAME, EVENT_KINDS, FAULT_KINDS
from rlpipe.lifecycle.readers import connect_ro, env_history, event_counts, fault_counts, kind_counts
from rlpipe.lifecycle.store import EnvLayout
from rlpipe.lifecycle.writer import LifecycleWriter

__all__ = [
    "DB_NAME",
    "EVENT_KINDS",
    "EnvLayout",
    "FAULT_KINDS",
    "LifecycleClient",
    "LifecycleWriter",
    "connect_ro",
    "env_history",
    "event_counts",
    "fault_counts",
    "kind_counts",
]
