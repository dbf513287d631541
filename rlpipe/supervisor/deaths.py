"""A worker's death attributed (issue 49): when a worker dies in an env's step (an env that
calls os._exit, a segfault in its native code, a step the watchdog ends), the driver reads
from the dead worker's segment which env it was stepping (H_ARMED, H_SLICE_LO and
H_SLICE_SERIAL, written by the worker and its C step loop) and the action the learner had
given it, and records it: in the `worker_restart` row's detail and as an error record of its
own, fingerprinted by the env type and how the worker ended, so errors_top10.md names it.
"""

from __future__ import annotations

import signal
import time

from rlpipe.envs.contract import DISCRETE
from rlpipe.shm.errorlog import stacktrace_hash
from rlpipe.shm.layout import H_ARMED, H_SLICE_LO, H_SLICE_SERIAL


def how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "ended by the watchdog"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def env_in_step(h, plan, env_id_offset: int) -> dict | None:
    """The env the dead worker of `h` was stepping (its generation's segment is still
    mapped), or None when it was between steps (or stepping through the pool of threads,
    which keeps no serial)."""
    views = h.views
    armed = views.load(H_ARMED) if views is not None else 0
    if not armed:
        return None
    i = views.load(H_SLICE_LO) + armed - views.load(H_SLICE_SERIAL) - 1
    if not 0 <= i < h.n:
        return None
    t = int(plan.env_type[h.env_lo + i])
    spec = plan.specs[t]
    acts = views.actions
    if spec.action_kind == DISCRETE:
        action = int(acts["discrete"][i])
    else:
        action = [round(float(a), 4) for a in acts["continuous"][i, : spec.action_n]]
    s = next(k for k, (lo, hi) in enumerate(h.bounds) if lo <= i < hi)
    return {
        "env_id": env_id_offset + h.env_lo + i,
        "env_type": plan.names[t],
        "last_action": action,
        "env_steps": int(h.slice_seq[s]),  # steps each env of its slice had made
    }


def death_record(h, found: dict, exitcode: int | None) -> dict:
    """The error record of a worker death in an env's step, for the error report."""
    ended = how_it_ended(exitcode)
    message = (
        f"worker {h.worker_id} died ({ended}) while stepping env {found['env_id']} "
        f"({found['env_type']}) at its step {found['env_steps'] + 1}, action {found['last_action']}"
    )
    return {
        "ts": round(time.time(), 3),
        "level": "ERROR",
        "env_id": found["env_id"],
        "env_type": found["env_type"],
        "error_type": "WorkerDeath",
        "stacktrace_hash": stacktrace_hash(f"WorkerDeath in a step of {found['env_type']}: {ended}"),
        "message": message,
        "traceback": message,
        "pid": h.proc.pid if h.proc is not None else None,
    }
