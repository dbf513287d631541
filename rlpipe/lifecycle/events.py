"""What a lifecycle event is: its kinds, its columns, and the checks the client and the writer share."""

from __future__ import annotations

# Only kinds that something emits: a kind a reader queries but nothing writes would read as
# "none happened" forever (a failed reset is an env_crash, the worker reports it as one).
EVENT_KINDS = frozenset(
    {
        "env_create",
        "env_crash",
        "env_hang",
        "env_stall",
        "env_rebuild",
        "env_quarantine",
        "group_wake",
        "worker_spawn",
        "worker_exit",
        "worker_term",
        "worker_kill",
        "worker_restart",
        "redis_restart",
        "chaos_inject",
        "chaos_quiet",
        "worker_ready",
        "redis_recovered",
        "driver_stall",
    }
)

# summary.json "faults" key -> the event kind it counts.
FAULT_KINDS = {
    "env_crashes": "env_crash",
    "env_hangs": "env_hang",
    "env_rebuilds": "env_rebuild",
    "quarantined": "env_quarantine",
    "worker_restarts": "worker_restart",
}

DB_NAME = "lifecycle.sqlite"
IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux

COLUMNS = ("ts", "run_id", "kind", "env_id", "env_type", "env_version", "worker_id", "generation", "detail")


def check_kind(kind: str) -> None:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown lifecycle event kind {kind!r}; expected one of {sorted(EVENT_KINDS)}")


def check_endpoint(endpoint: str) -> None:
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if len(path.encode()) > IPC_PATH_MAX:
            raise ValueError(
                f"ipc endpoint path is {len(path.encode())} bytes, over the OS limit of "
                f"{IPC_PATH_MAX}: {path!r}; put the socket under a shorter directory"
            )
