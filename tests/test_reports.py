"""The after-the-run reports: chaos recovery from the lifecycle log, and the health report
(health_report.md + PNG plots) built from a run directory's files."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from conftest import read_summary
from rlpipe.lifecycle import LifecycleWriter
from rlpipe.lifecycle.recovery import recovery_report, restart_reasons
from rlpipe.telemetry.health import PLOT_GROUPS, PLOT_MEMORY, PLOT_RETURNS, PLOT_SPS, REPORT_NAME, write_health_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = (PLOT_SPS, PLOT_RETURNS, PLOT_MEMORY, PLOT_GROUPS)
T0 = 1_700_000_000.0

SUMMARY = {
    "stage": "day5",
    "env_count": 8,
    "env_types": {"cartpole": 4, "acrobot": 4},
    "active_envs_end": 8,
    "env_steps": 80_000,
    "wall_s": 100.0,
    "sps": 800.0,
    "startup_first_step_s": 1.5,
    "all_envs_ready_s": 2.5,
    "updates": 12,
    "episodes": 345,
    "mean_return_last100": {"cartpole": 31.5, "acrobot": -480.0},
    "peak_rss_mb": 900.0,
    "random_return": {"cartpole": 21.0, "acrobot": -499.0},
    "initial_policy_return": {"cartpole": 19.5},
    "learned": {"cartpole": "learned", "acrobot": "did not learn"},
    "shm_bytes": 123456,
    "faults": {"env_crashes": 3, "env_hangs": 1, "env_rebuilds": 4, "quarantined": 1, "worker_restarts": 2},
    "board": {"torn_retries": 0},
    "cgroup_driver": "none",
    "redis": "embedded",
    "env_versions": {"cartpole": ["aaaa"], "acrobot": ["bbbb"]},
    "loss_std": 0.25,
    "loss_std_checkpoints": {"0.25": 0.5, "0.5": 0.4, "0.75": 0.3},
    "resumed_from_step": 0,
    "dist": {"world_size": 1, "params_in_sync": None},
}

ERRORS_MD = """# Errors: top 10 by stack-trace hash

Updated 2026-01-01 00:00:00 UTC. 4 error record(s), 1 distinct stack trace(s), 0 dropped (ring full), 0 unreadable.

| # | stacktrace hash | count | error type | env types | envs | first seen (UTC) | last seen (UTC) |
|--:|---|--:|---|---|--:|---|---|
| 1 | `deadbeefdeadbeef` | 4 | InjectedFault | cartpole ×4 | 1 | 2026-01-01 00:00:00 | 2026-01-01 00:01:00 |

## Samples

### 1. `deadbeefdeadbeef`: InjectedFault ×4
"""


def _write_lifecycle(db_path: Path) -> None:
    """Two workers of 4 envs; four injections, three healed (kill 2.0 s, stop 14.0 s, redis
    1.5 s: every worker beat again 0.5 s after the restart), the last worker kill never healed."""
    w = LifecycleWriter(db_path, f"inproc://lc-{uuid.uuid4().hex}", run_id="test-run")
    w.start()
    rec = w.record
    for wid in (0, 1):
        rec("worker_spawn", worker_id=wid, generation=1, detail={"pid": 100 + wid, "envs": 4}, ts=T0)
        for i in range(4):
            env_id = 4 * wid + i
            rec(
                "env_create",
                env_id=env_id,
                env_type="cartpole" if wid == 0 else "acrobot",
                env_version="v",
                worker_id=wid,
                generation=1,
                ts=T0 + 0.1,
            )
        rec("worker_ready", worker_id=wid, generation=1, detail={"since_spawn_s": 1.0}, ts=T0 + 1)
    for n in range(3):
        rec("env_crash", env_id=1, env_type="cartpole", worker_id=0, generation=1, ts=T0 + 2 + n)
        rec("env_rebuild", env_id=1, env_type="cartpole", worker_id=0, generation=1, ts=T0 + 2.1 + n)
        rec("env_create", env_id=1, env_type="cartpole", worker_id=0, generation=1, ts=T0 + 2.2 + n)
    rec("env_hang", env_id=5, env_type="acrobot", worker_id=1, generation=1, ts=T0 + 6)
    rec("env_rebuild", env_id=5, env_type="acrobot", worker_id=1, generation=1, ts=T0 + 6.5)
    rec("env_quarantine", env_id=2, env_type="cartpole", worker_id=0, generation=1, ts=T0 + 7)

    # kill_worker on worker 0: replaced, ready 2.0 s after the injection
    rec("chaos_inject", worker_id=0, generation=1, detail={"what": "kill_worker", "pid": 100, "t": 10.0}, ts=T0 + 10)
    rec("worker_restart", worker_id=0, generation=1, detail={"reason": "exited", "exitcode": -9}, ts=T0 + 11)
    rec("worker_spawn", worker_id=0, generation=2, detail={"pid": 200, "envs": 4}, ts=T0 + 11.2)
    rec("worker_ready", worker_id=0, generation=2, detail={"since_spawn_s": 0.8}, ts=T0 + 12)
    # stop_worker on worker 1: a stale ready of the stopped generation does not count
    rec("chaos_inject", worker_id=1, generation=1, detail={"what": "stop_worker", "pid": 101, "t": 20.0}, ts=T0 + 20)
    rec("worker_ready", worker_id=1, generation=1, detail={"since_spawn_s": 9.0}, ts=T0 + 21)
    rec("worker_term", worker_id=1, generation=1, detail={"reason": "heartbeat"}, ts=T0 + 28)
    rec("worker_restart", worker_id=1, generation=1, detail={"reason": "heartbeat"}, ts=T0 + 30)
    rec("worker_spawn", worker_id=1, generation=2, detail={"pid": 201, "envs": 4}, ts=T0 + 30.5)
    rec("worker_ready", worker_id=1, generation=2, detail={"since_spawn_s": 3.5}, ts=T0 + 34)
    # Redis killed, restarted 1 s later
    rec("chaos_inject", detail={"what": "kill_redis", "pid": 50, "t": 40.0}, ts=T0 + 40)
    rec("redis_restart", detail={"url_kind": "embedded"}, ts=T0 + 41)
    rec("redis_recovered", detail={"since_restart_s": 0.5, "workers": 2}, ts=T0 + 41.5)
    # a second kill of worker 0 that the run never healed
    rec("chaos_inject", worker_id=0, generation=2, detail={"what": "kill_worker", "pid": 200, "t": 50.0}, ts=T0 + 50)
    w.stop()
    assert w.rows_written > 30 and w.bad_messages == 0


def _write_tb(tb_dir: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    sw = SummaryWriter(str(tb_dir))
    for i, step in enumerate(range(0, 80_001, 10_000)):
        sw.add_scalar("charts/sps", 700.0 + 10 * i, step)
        sw.add_scalar("envs/active", 8, step)
        sw.add_scalar("charts/episodic_return/cartpole", 10.0 + 2.5 * i, step)
        sw.add_scalar("charts/episodic_return/acrobot", -500.0 + i, step)
        sw.add_scalar("losses/total", 1.0 / (i + 1), step)
        sw.add_scalar("memory/pss_mb", 500.0 + 50 * i, step)
        sw.add_scalar("workers/rss_mb_max", 100.0 + i, step)
    sw.close()
    # a second event file in the same directory (as the driver's hparams writer makes)
    sw = SummaryWriter(str(tb_dir), filename_suffix=".second")
    sw.add_scalar("hparams/sps", 800.0, 0)
    sw.close()


@pytest.fixture
def synthetic_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    _write_lifecycle(run / "lifecycle.sqlite")
    _write_tb(run / "tb")
    (run / "summary.json").write_text(json.dumps(SUMMARY, indent=2))
    (run / "errors_top10.md").write_text(ERRORS_MD)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "ckpt_000000080000.pt").write_bytes(b"\0" * 2048)
    return run


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


# --- recovery --------------------------------------------------------------------------------


def test_recovery_report_matches_injections(synthetic_run: Path):
    db = synthetic_run / "lifecycle.sqlite"
    rep = recovery_report(db)
    assert (rep["injected"], rep["recovered"], rep["unrecovered"]) == (4, 3, 1)
    assert rep["by_kind"]["kill_worker"] == {"injected": 2, "recovered": 1, "p50_s": 2.0, "p99_s": 2.0}
    assert rep["by_kind"]["stop_worker"]["recovered"] == 1
    assert rep["by_kind"]["stop_worker"]["p50_s"] == pytest.approx(14.0)  # not the stale gen-1 ready
    # healed when the workers beat again, not at the restart (a ping)
    assert rep["by_kind"]["kill_redis"]["p50_s"] == pytest.approx(1.5)
    assert rep["recover_s_p50"] == pytest.approx(2.0)  # of [1.5, 2, 14]
    assert rep["recover_s_p99"] == pytest.approx(13.76)  # linear interpolation
    # per-env rate 80,000 / 8 / 100 s = 100/s; (2 s + 14 s) x 4 envs x 100/s; Redis costs none
    assert rep["per_env_sps"] == pytest.approx(100.0)
    assert rep["lost_env_steps_est"] == 6400
    unhealed = [e for e in rep["events"] if e["recover_s"] is None]
    assert [(e["what"], e["worker_id"], e["generation"]) for e in unhealed] == [("kill_worker", 0, 2)]
    assert restart_reasons(db) == {"exited": 1, "heartbeat": 1}
    # read-only: no -wal/-shm files appear beside a db at rest
    assert sorted(p.name for p in synthetic_run.glob("lifecycle.sqlite*")) == ["lifecycle.sqlite"]


def test_recovery_report_without_summary_has_no_loss_estimate(synthetic_run: Path, tmp_path: Path):
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "lifecycle.sqlite").write_bytes((synthetic_run / "lifecycle.sqlite").read_bytes())
    rep = recovery_report(lone / "lifecycle.sqlite")
    assert rep["recovered"] == 3 and rep["lost_env_steps_est"] is None and rep["per_env_sps"] is None


def test_recovery_report_of_a_run_without_chaos(tmp_path: Path):
    db = tmp_path / "lifecycle.sqlite"
    with LifecycleWriter(db, f"inproc://lc-{uuid.uuid4().hex}", run_id="calm") as w:
        w.record("worker_spawn", worker_id=0, generation=1, detail={"envs": 2}, ts=T0)
    rep = recovery_report(db)
    assert (rep["injected"], rep["recovered"], rep["unrecovered"]) == (0, 0, 0)
    assert rep["recover_s_p50"] is None and rep["by_kind"] == {}
    assert restart_reasons(db) == {}


# --- health report ---------------------------------------------------------------------------


def test_health_report_of_synthetic_run(synthetic_run: Path):
    out = write_health_report(synthetic_run)
    assert out == synthetic_run / REPORT_NAME
    md = out.read_text()
    for name in PLOTS:
        assert _is_png(synthetic_run / name), name
        assert f"]({name})" in md
    # identity and headline figures come from summary.json
    assert "| stage | day5 |" in md and "| cartpole | 4 | `aaaa` |" in md
    assert "| `sps` | 800 |" in md and "| `startup_first_step_s` | 1.5 |" in md
    # returns: last-100 from summary, first/last from TensorBoard (both event files loaded)
    assert "| cartpole | 4 | 31.5 | 21 | 19.5 | learned | 10 | 30 | up (+20) | 9 |" in md
    assert "| acrobot | 4 | -480 | -499 | missing | did not learn |" in md
    assert "every env type learned (above its random return): **no**" in md and "did not learn: acrobot" in md
    assert "2 event file(s)" in md
    # faults: summary vs lifecycle rows, groups from env_create
    assert "| `env_crashes` | 3 | 3 |" in md
    assert "| 0 | 4 | cartpole×4 | 2 | 1 | 3 | 0 | 1 |\n" in md  # crash, hang, quarantine
    assert "| `exited` | 1 |" in md and "| `heartbeat` | 1 |" in md
    # chaos recovery
    assert "injected: 4, recovered: 3, unrecovered: 1" in md
    assert "**not recovered**" in md and "6,400" in md
    # top errors copied, checkpoints listed
    assert "[errors_top10.md](errors_top10.md)" in md and "`deadbeefdeadbeef`" in md
    assert "`ckpt_000000080000.pt` | 80,000 |" in md
    # verdicts
    assert "all envs active at end: **yes**" in md
    assert "every injected fault recovered: **no**" in md
    assert "no worker lost: **yes**" in md
    assert "peak memory under 12 GiB: **yes**" in md
    assert "checkpoint written: **yes**" in md
    assert sorted(p.name for p in synthetic_run.glob("lifecycle.sqlite*")) == ["lifecycle.sqlite"]


def test_a_replacement_that_never_stepped_is_a_lost_worker(synthetic_run: Path):
    """A restart followed by a spawn but no worker_ready of the new generation: lost."""
    w = LifecycleWriter(synthetic_run / "lifecycle.sqlite", f"inproc://lc-{uuid.uuid4().hex}", run_id="test-run")
    with w:
        w.record("worker_restart", worker_id=1, generation=2, detail={"reason": "exited"}, ts=T0 + 60)
        w.record("worker_spawn", worker_id=1, generation=3, detail={"pid": 301, "envs": 4}, ts=T0 + 60.2)
    md = write_health_report(synthetic_run).read_text()
    assert "no worker lost: **no**" in md and "without a replacement that stepped: 1" in md


def test_health_report_links_the_evaluation(synthetic_run: Path):
    md = write_health_report(synthetic_run).read_text()
    assert "Evaluation: none yet" in md
    (synthetic_run / "eval").mkdir()
    (synthetic_run / "eval" / "returns.md").write_text("# Evaluation\n")
    (synthetic_run / "eval" / "cartpole.mp4").write_bytes(b"\0" * 64)
    md = write_health_report(synthetic_run).read_text()
    assert "[eval/returns.md](eval/returns.md)" in md and "[cartpole](eval/cartpole.mp4)" in md


def test_health_report_with_missing_inputs(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    md = write_health_report(empty).read_text()
    assert "| `summary.json` | missing |" in md and "| `tb/` | missing |" in md
    assert "| `lifecycle.sqlite` | missing |" in md and "checkpoints/ is missing" in md
    assert "errors_top10.md is missing" in md
    assert "all envs active at end: **n/a**" in md and "checkpoint written: **no**" in md
    assert not any((empty / name).exists() for name in PLOTS)
    assert "could not be built" not in md

    # a summary alone: its figures are reported, the rest still missing; a stale plot is removed
    (empty / "summary.json").write_text(json.dumps(SUMMARY))
    (empty / PLOT_SPS).write_bytes(PNG_MAGIC)
    (empty / "tb").mkdir()
    md = write_health_report(empty).read_text()
    assert "| `sps` | 800 |" in md and "tb/ holds no event files" in md
    assert not (empty / PLOT_SPS).exists()
    assert "could not be built" not in md


def test_health_report_of_real_run(cartpole_multirun: Path):
    run_dir = cartpole_multirun / "0"  # 16 CartPoles, 15k env steps (tests/conftest.py)
    summary = read_summary(run_dir)
    md = write_health_report(run_dir).read_text()
    assert "cartpole" in md
    assert f"| `env_steps` | {summary['env_steps']:,} |" in md
    assert "could not be built" not in md
    for name in (PLOT_SPS, PLOT_RETURNS, PLOT_GROUPS):
        assert _is_png(run_dir / name), name
    assert "No faults were injected" in md
