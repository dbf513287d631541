"""One evaluation round of a run in progress, as the driver starts it
(rlpipe/supervisor/evaluation.py):

    python -m rlpipe.eval.during <run_dir> --weights <snapshot.pt> --history <history.jsonl>
        --episodes N --budget-s S --max-steps M --wall-s W --driver-pid P

It lowers its own priority to nice 19 before importing torch, loads the run's config and env
plan from the run directory and the policy from the driver's snapshot (`loader.load_run`),
plays N deterministic episodes of each env type on envs it builds for itself (`play.play`,
the same code as `python -m rlpipe.eval`, and the same env seeds every round, so two rounds
differ by their weights only), at most S seconds per type, and appends one JSON line to the
history:

    {"env_steps", "wall_s", "eval_s", "types": {type: {"mean", "std", "episodes", "cut"}}}

`env_steps` is the step count the weights were taken at, `wall_s` the run's seconds then, and
`eval_s` what the round took. A driver that dies (even by SIGKILL) takes the round with it:
a thread watches the parent and ends the process, which holds nothing that outlives it.

Exit codes: 0 the line was appended, 2 the run or the weights cannot be loaded (one line on
stderr), anything else a crash (the driver logs it and tries again at the next round).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from rlpipe.procs import lower_priority

# The env seeds of every round: those of `python -m rlpipe.eval` (its --seed default), apart
# from the training seeds; with the same weights both play the same deterministic episodes.
EVAL_SEED = 10_000
PARENT_CHECK_S = 1.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rlpipe.eval.during", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--weights", type=Path, required=True, help="the driver's policy snapshot")
    p.add_argument("--history", type=Path, required=True, help="the JSON-lines file a round appends to")
    p.add_argument("--episodes", type=int, required=True)
    p.add_argument("--budget-s", type=float, required=True, help="the most seconds spent on one type")
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--wall-s", type=float, required=True, help="the run's seconds when the weights were taken")
    p.add_argument("--driver-pid", type=int, default=None, help="end when this parent is gone")
    return p.parse_args(argv)


def watch_parent(pid: int) -> None:
    """End this process when its parent (the driver) is gone: reparented, getppid changes."""

    def watch():
        while os.getppid() == pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="rlpipe-eval-parent", daemon=True).start()


def play_round(run, episodes: int, budget_s: float, max_steps: int) -> dict:
    """{type: {"mean", "std", "episodes", "cut"}} of one round."""
    from rlpipe.envs.registry import make_factory
    from rlpipe.learner import play

    nodes = {t.name: t.node for t in run.spec.env_types}
    types = {}
    for t, name in enumerate(run.plan.names):
        eps = play.play(
            run.policy,
            run.plan,
            t,
            make_factory(nodes[name]),
            episodes,
            True,
            EVAL_SEED,
            max_steps,
            run.spec.worker.step_timeout_s,
            budget_s=budget_s,
        )
        stats = eps.stats()
        types[name] = {k: stats[k] for k in ("mean", "std", "episodes", "cut")}
    return types


def append_line(path: Path, record: dict) -> None:
    """One line, one write(2) on an O_APPEND file: a reader sees the whole line or none of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    t_start = time.monotonic()
    lower_priority(19)  # only spare CPU: the driver and the workers come first
    args = parse_args(argv)
    if args.driver_pid is not None:
        watch_parent(args.driver_pid)
    import torch

    from rlpipe.eval.loader import EvalError, load_run

    torch.set_num_threads(1)  # batches of a few rows; more threads would only take CPU from training
    try:
        run = load_run(args.run_dir, weights=args.weights)
    except EvalError as exc:
        print(f"rlpipe.eval.during: {exc}", file=sys.stderr)
        return 2
    with torch.no_grad():
        types = play_round(run, args.episodes, args.budget_s, args.max_steps)
    append_line(
        args.history,
        {
            "env_steps": run.env_steps,
            "wall_s": round(args.wall_s, 3),
            "eval_s": round(time.monotonic() - t_start, 3),
            "types": types,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
