"""Checkpoints across a kill -9: a run resumed in its directory reaches its step target."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import time

from conftest import REPO, read_summary, rlpipe_cmd, run_cli

OVERRIDES = [
    "env_count=32",
    "run.total_env_steps=30000",  # the first start is killed a few thousand steps in
    "run.duration_s=300",
    "learner.checkpoint_interval_s=2",
    "reward_norm=per_env",
    "reward_norm.sync_every=50",
]


def test_kill9_after_first_checkpoint_then_resume(short_tmp):
    run_dir = short_tmp / "run"
    proc = subprocess.Popen(
        rlpipe_cmd(run_dir, *OVERRIDES), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not list((run_dir / "checkpoints").glob("ckpt_*.pt")):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    saved = int(sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1].stem.split("_")[1])
    assert not (run_dir / "summary.json").exists()

    out = run_cli(run_dir, *OVERRIDES, "run.resume=true")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] >= saved > 0
    assert summary["env_steps"] >= 30000
    assert summary["updates"] > 0
    # The killed run's embedded Redis died with it: the resumed workers' reward statistics can
    # only have come from the checkpoint.
    with contextlib.closing(sqlite3.connect(run_dir / "lifecycle.sqlite")) as db:
        runs = [
            r
            for (r,) in db.execute(
                "SELECT run_id FROM events WHERE kind = 'worker_spawn' GROUP BY run_id ORDER BY MIN(ts)"
            )
        ]
        assert len(runs) == 2
        spawned = [
            json.loads(d)
            for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'worker_spawn' AND run_id = ?", (runs[1],))
        ]
    restored = [d["reward_count_restored"] for d in spawned if "reward_count_restored" in d]
    assert restored and all(n > 0 for n in restored)


def test_corrupt_checkpoints_are_a_clear_error(short_tmp):
    run_dir = short_tmp / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for step in (100, 200):
        (run_dir / "checkpoints" / f"ckpt_{step:012d}.pt").write_bytes(b"not a checkpoint")
    out = run_cli(run_dir, *OVERRIDES, "run.resume=true", timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "ckpt_000000000200.pt" in out.stderr and "ckpt_000000000100.pt" in out.stderr
    assert "not a checkpoint file" in out.stderr
    assert "weights_only" not in out.stderr  # torch's advice to load it unsafely is not ours to give
    json.dumps(out.stderr)  # one paragraph of text, printable as is
