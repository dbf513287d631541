"""The endurance figures: a bounded history, the long-run fit and verdict, and a real run that
charts its resources and judges them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlpipe.bounded import FigureRow, Thinned, ThinnedPairs
from rlpipe.telemetry.longrun import figure_verdict, long_run, theil_sen
from tests.conftest import load_benchmark, read_summary, run_cli


def test_thinned_stays_bounded_and_evenly_spread():
    series = Thinned(64)
    for i in range(100_000):
        series.add(i)
        assert len(series) < 64
    kept = list(series)
    steps = np.diff(kept)
    assert series.offered == 100_000
    assert len(set(steps)) == 1 and steps[0] == series.stride  # every stride-th point, no gaps
    assert kept[0] == 0 and kept[-1] > 100_000 - 2 * series.stride  # the whole run, up to now


@pytest.mark.parametrize("capacity", [2, 3, 5, 8])
def test_thinned_survivors_are_one_stride_apart_at_every_capacity(capacity):
    series = Thinned(capacity)
    for i in range(1000):
        series.add(i)
        kept = list(series)
        assert all(b - a == series.stride for a, b in zip(kept, kept[1:])), (i, kept)


def test_thinned_pairs_keep_the_points_of_thinned_tuples_in_few_python_objects():
    """The loss history: the same points as a Thinned of (time, loss) tuples through several
    halvings, read back as tuples, and a full history adds no Python object per point (the
    driver's block count is a leak detector; as tuples it climbed three blocks an update)."""
    import gc
    import sys

    rng = np.random.default_rng(2)
    points = [(1000.0 + 0.37 * i, float(v)) for i, v in enumerate(rng.normal(0.5, 0.2, 50_000))]
    as_tuples, as_pairs = Thinned(4096), ThinnedPairs(4096)
    for point in points:
        as_tuples.add(point)
        as_pairs.add(point)
    assert list(as_pairs) == list(as_tuples) and len(as_pairs) == len(as_tuples)
    assert as_pairs.stride == as_tuples.stride == 16 and as_pairs.offered == 50_000

    blocks = {}
    for kind in (Thinned, ThinnedPairs):
        gc.collect()
        before = sys.getallocatedblocks()
        history = kind(4096)
        for k in range(4095):  # full, before its first halving
            history.add((1000.0 + 0.37 * k, 0.5 + k * 1e-6))
        gc.collect()
        blocks[kind] = sys.getallocatedblocks() - before
        del history
    assert blocks[ThinnedPairs] < 20 < 3 * 4095 <= blocks[Thinned], blocks


def test_theil_sen_ignores_a_sawtooth_and_brackets_the_slope():
    rng = np.random.default_rng(0)
    t = np.arange(360) * 10.0  # an hour at one sample per 10 s
    y = 3000 + 0.05 * t + rng.normal(0, 5, len(t))
    y[::15] += 300  # a tooth every 150 s
    slope, lo, hi, intercept = theil_sen(t, y)
    assert lo <= 0.05 <= hi and abs(slope - 0.05) < 0.005
    assert abs(intercept - 3000) < 10
    lsq = np.polyfit(t, y, 1)[0]
    assert abs(slope - 0.05) < abs(lsq - 0.05) or abs(lsq - 0.05) < 0.005


def test_verdicts_flat_grows_past_budget_falls():
    rng = np.random.default_rng(1)
    t = np.linspace(1800, 3600, 180)
    noise = rng.normal(0, 10, len(t))
    assert figure_verdict(t, 3000 + noise, 3600, 518400, 24000)["verdict"] == "flat"
    # +0.5 %/h on a 3 GB level: a trend the samples can see but under the 1 %/h tolerance
    small = figure_verdict(t, 3000 + 15 / 3600 * t + noise * 0.1, 3600, 518400, 24000)
    assert small["verdict"] == "flat" and 0.3 < small["slope_pct_per_h"] < 0.7
    grows = figure_verdict(t, 3000 + 100 / 3600 * t + noise, 3600, 518400, None)
    assert grows["verdict"] == "grows" and grows["slope_ci_per_h"][0] > 0
    # 100 MB/h for six days is 14.4 GB more: past a 12 GB budget
    past = figure_verdict(t, 3000 + 100 / 3600 * t + noise, 3600, 518400, 12000)
    assert past["verdict"] == "grows past budget" and past["projected"] > 12000
    assert abs(past["projected"] / (3100 + 100 * (518400 - 3600) / 3600) - 1) < 0.05
    assert figure_verdict(t, 3000 - 100 / 3600 * t + noise, 3600, 518400, None)["verdict"] == "falls"
    zero = figure_verdict(t, np.zeros(len(t)), 3600, 518400, None)
    assert zero["verdict"] == "flat" and zero["slope_pct_per_h"] is None


def test_the_soaks_checks_take_falling_memory_as_no_leak_and_fewer_threads_as_a_loss():
    """benchmarks/soak.py's checks on verdicts made by figure_verdict: worker and Redis
    memory pass flat or falling and fail growing; the driver's fds and threads pass flat only."""
    checks = load_benchmark("soak").checks
    t = np.linspace(1800, 3600, 180)

    def verdict(per_h: float) -> dict:
        return figure_verdict(t, 100 + per_h / 3600 * t, 3600, 518400, None)

    def judged(trends: dict) -> dict[str, bool]:
        summary = {"env_count": 8, "active_envs_end": 8, "long_run": {k: verdict(v) for k, v in trends.items()}}
        out = checks(0, summary, {"unrecovered": 0, "recovered": 0, "injected": 0})
        return {what.split()[0]: ok for what, ok, _why in out if what.split()[0] in trends}

    memory = ("workers/rss_less_env_leak_mb_max", "redis/used_memory_mb")
    handles = ("driver/fds", "driver/threads")
    assert judged(dict.fromkeys(memory + handles, 0.0)) == dict.fromkeys(memory + handles, True)
    assert judged(dict.fromkeys(memory + handles, -10.0)) == {
        **dict.fromkeys(memory, True),
        **dict.fromkeys(handles, False),
    }
    assert judged(dict.fromkeys(memory + handles, +10.0)) == dict.fromkeys(memory + handles, False)


def test_long_run_fits_the_second_half_only():
    # a ramp during the first half (start-up) and flat after it: flat
    samples = [(float(s), {"driver/rss_mb": min(s, 1800) * 1.0 + (s % 7)}) for s in range(0, 3601, 10)]
    verdicts = long_run(samples, 3600.0, 518400.0, {})
    assert verdicts["driver/rss_mb"]["verdict"] == "flat"
    assert verdicts["driver/rss_mb"]["points"] == 181
    assert long_run(samples[:5], 3600.0, 518400.0, {}) == {}  # too few points: no verdict


def test_a_history_of_figure_rows_holds_few_python_objects_and_judges_as_dicts():
    """The resource history's samples as FigureRows: a full history costs a few thousand
    Python object blocks, not one per figure and sample (the driver's block count is a leak
    detector), rows of the same names share their index, a figure that comes and goes is
    read as missing, and the long-run verdicts are those of the same samples as dicts."""
    import gc
    import sys

    def figures(k: int) -> dict[str, float]:
        out = {f"workers/{i}/rss_mb": 100.0 + i + (k % 7) for i in range(46)}
        out["driver/fds"] = 121
        if k >= 200:  # a figure that appears late (the update process's, say)
            out["update/rss_mb"] = 430.0 + k * 0.01
        return out

    def history(row: bool) -> Thinned:
        h = Thinned(720)
        for k in range(719):
            sample = figures(k)
            h.add((float(k * 5), FigureRow(sample, h.points[-1][1] if h.points else None) if row else sample))
        return h

    blocks = {}
    for row in (False, True):
        gc.collect()
        before = sys.getallocatedblocks()
        h = history(row)
        gc.collect()
        blocks[row] = sys.getallocatedblocks() - before
        if row:
            rows = [r for _t, r in h]
            assert rows[0].index is rows[199].index and rows[200].index is rows[-1].index
            assert rows[0].get("update/rss_mb") is None and rows[-1]["driver/fds"] == 121
            assert dict(rows[-1]) == figures(718)
        del h
    assert blocks[True] < 6 * 719 < 40 * 719 < blocks[False], blocks
    as_rows, as_dicts = (long_run(list(history(row)), 3595.0, 518400.0, {}) for row in (True, False))
    assert as_rows == as_dicts and len(as_rows) == 48


@pytest.mark.slow  # a 40 s run sampling its resources every 0.5 s: the soak in small
def test_a_run_charts_its_resources_and_judges_them(short_tmp):
    """A 40 s run with the verdict's minimum lowered: resources/* in TensorBoard, every role's
    figures in the verdict, the health report's long-run table."""
    from rlpipe.telemetry.tb_events import read_scalars

    run_dir = short_tmp / "run"
    out = run_cli(
        run_dir,
        "env_count=32",
        "groups.size=16",
        "run.total_env_steps=null",
        "run.duration_s=40",
        "logging.long_run_min_s=10",
        "logging.resources_interval_s=0.5",
        "learner.checkpoint_interval_s=5",
        "learner.backlog=hold",  # serving while it trains: the update in its own process
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    lr = summary["long_run"]
    for name in (
        "driver/rss_mb",
        "driver/fds",
        "driver/threads",
        "forkserver/rss_mb",
        "redis/rss_mb",
        "update/rss_mb",
        "update/fds",
        "workers/rss_mb_max",
        "workers/rss_mb_sum",
        "workers/count",
        "tree/pss_mb",
        "shm/run_mb",
        "redis/used_memory_mb",
        "redis/keys",
        "lifecycle/rows",
        "run_dir/tb_mb",
        "run_dir/total_mb",
        "run_dir/lifecycle_mb",
        "run_dir/checkpoints_mb",
    ):
        assert name in lr, name
        assert lr[name]["verdict"] in ("flat", "grows", "falls", "grows past budget")
    assert lr["workers/count"]["level"] == 2 and lr["workers/count"]["verdict"] == "flat"
    assert lr["driver/rss_mb"]["budget"] > 1000  # the machine's memory, in MiB
    assert lr["run_dir/checkpoints_mb"]["level"] > 0  # the periodic checkpoints are counted
    # the shm figure is what the run's segments hold, never more than their nominal size: the
    # workers' (summary's shm_bytes) plus the driver's doorbell words, each rounded up to whole
    # pages once every page is touched (a few pages in all)
    assert 0 < lr["shm/run_mb"]["level"] * 2**20 <= summary["shm_bytes"] + 16 * 4096
    json.dumps(summary, allow_nan=False)  # plain JSON: no NaN or Infinity
    tags = read_scalars(run_dir / "tb")
    assert {
        "resources/driver/rss_mb",
        "resources/workers/rss_mb_max",
        "resources/redis/used_memory_mb",
        "resources/run_dir/total_mb",
        "resources/lifecycle/rows",
        "resources/driver/rss_floor_mb",
        "resources/driver/rss_anon_floor_mb",
        "resources/driver/heap/in_use_mb",
        "resources/driver/heap/free_kept_mb",
    } <= set(tags)
    # the floor: the lowest of the driver's RSS reads between two samples, so never above them
    floor, rss = tags["resources/driver/rss_floor_mb"].values, tags["resources/driver/rss_mb"].values
    assert len(floor) == len(rss) and (0 < floor).all() and (floor <= rss * 1.02).all()
    anon = tags["resources/driver/rss_anon_floor_mb"].values
    assert len(anon) == len(floor) and (0 < anon).all() and (anon <= floor).all()
    report = (run_dir / "health_report.md").read_text()
    assert "## Long run" in report and "`driver/rss_mb`" in report
    assert (run_dir / "health_resources.png").is_file()


def test_a_run_under_the_default_minimum_has_no_verdict_and_says_why(cartpole_multirun):
    """A run shorter than logging.long_run_min_s (10 minutes): long_run null, and the health
    report says why."""
    short = cartpole_multirun / "0"  # 16 CartPoles, 15k env steps (tests/conftest.py)
    assert read_summary(short)["long_run"] is None
    assert "No long-run verdict" in (short / "health_report.md").read_text()


def test_chaos_forgets_the_stopped_workers_that_are_gone():
    """Chaos keeps the pids it SIGSTOPped (to continue them at teardown and not stop them
    twice); a six-day run stops thousands, so the dead ones are dropped at each new stop."""
    import subprocess
    import sys

    from rlpipe.supervisor.chaos import live_pids

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        assert live_pids({alive.pid, dead.pid}) == {alive.pid}
    finally:
        alive.kill()
        alive.wait()


def test_a_worker_tells_its_envs_emulated_leak_from_its_own_rss(short_tmp):
    """unity_sim leaks on purpose (touched pages, up to leak_max_mb per env): the worker puts
    those bytes in its header, and the sampler charts the largest worker's RSS without them,
    the figure a soak judges flat while the emulated leak grows as designed."""
    from rlpipe.telemetry.tb_events import read_scalars

    run_dir = short_tmp / "run"
    out = run_cli(
        run_dir,
        "env_mix=images",
        "~env_mix.types.atari",  # unity_sim alone: no ALE or MiniGrid builds
        "~env_mix.weights.atari",
        "~env_mix.types.minigrid",
        "~env_mix.weights.minigrid",
        "buffer=small",
        "env_count=2",
        "groups.size=2",
        "learner.cnn_channels=[4,8,8]",
        "learner.cnn_out=16",
        "env_mix.types.unity_sim.warmup_ms=10",
        "env_mix.types.unity_sim.leak_bytes_per_step=1048576",  # 2 MiB per env after 2 steps
        "env_mix.types.unity_sim.leak_max_mb=2.0",
        "logging.random_return_episodes=0",  # no probe of random returns beside the run's start
        "learner.mode=random",  # what is measured is memory: no CNN to serve and train for 20 s
        "run.total_env_steps=null",
        # a sample every 0.5 s, charted every second from the start-up on: a start of 15 s (a
        # loaded machine) still leaves a few charts with both envs at their cap
        "run.duration_s=20",
        "logging.resources_interval_s=0.5",
        "logging.health_interval_s=1",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    tags = read_scalars(run_dir / "tb")
    leak = tags["resources/workers/env_leak_mb_sum"].values
    rss = tags["resources/workers/rss_mb_max"].values
    own = tags["resources/workers/rss_less_env_leak_mb_max"].values
    assert leak.max() == pytest.approx(4.0)  # both envs at their cap
    capped = leak == leak.max()
    assert np.allclose(rss[capped] - own[capped], 4.0, atol=0.01)  # one worker: the max is it
    assert (own <= rss).all()


def test_the_periodic_charts_thin_out_after_the_first_ten_minutes():
    """Every 2 s while a user watches a run start, every 10 s after: a six-day run's
    TensorBoard is a fifth of what a 2 s cadence writes (the soak's 0.9 GB)."""
    from rlpipe.supervisor.driver import TB_DETAIL_S, charts_interval_s

    assert charts_interval_s(0.0) == charts_interval_s(TB_DETAIL_S - 1) == 2.0
    assert charts_interval_s(TB_DETAIL_S) == charts_interval_s(6 * 86400) == 10.0
