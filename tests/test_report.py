"""`python -m rlpipe.report`: a two-job multirun compared side by side, a killed run's health
report rebuilt from its files, and the error for a directory that is neither."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, read_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def report_cli(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlpipe.report", str(path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def report_main(path: Path, capsys) -> tuple[int, str]:
    """The CLI's main in this process (report_cli covers the entry point once)."""
    from rlpipe.report.__main__ import main

    code = main([str(path)])
    return code, capsys.readouterr().err


@pytest.fixture
def multirun(cartpole_multirun):
    return cartpole_multirun


def test_multirun_comparison_has_a_row_per_job_and_overlay_plots(multirun):
    res = report_cli(multirun)
    assert res.returncode == 0, res.stderr[-3000:]
    md = (multirun / "comparison.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| [")]
    assert len(rows) == 2
    assert "run.seed=1" in rows[0] and "run.seed=2" in rows[1] and "finished" in rows[0]
    assert "`env_count=16`" in md  # the overrides both jobs share
    assert "| 0 | " in md and "cartpole" in md  # the per-type return table
    pngs = {p.name for p in multirun.glob("comparison_*.png")}
    assert {"comparison_returns.png", "comparison_loss.png"} <= pngs
    # throughput is charted every 2 s and once more at the loop's end (its last window): a
    # job of these 15k steps makes one point or two as the machine's speed has it, and one
    # point per job is no curve (rlpipe/report/overlay.py)
    from rlpipe.telemetry.tb_events import read_scalars

    sps_points = [len(read_scalars(multirun / job / "tb")["charts/sps"].steps) for job in ("0", "1")]
    assert min(sps_points) >= 1
    assert ("comparison_sps.png" in pngs) == (max(sps_points) >= 2), sps_points
    for name in pngs:
        assert (multirun / name).read_bytes()[:8] == PNG_MAGIC and f"]({name})" in md


def test_a_later_job_counts_its_own_startup_cpu(multirun):
    """Job 1 runs in job 0's driver process and forks from job 0's forkserver: its
    startup_cpu_s counts from its own start. Job 0's also holds the interpreter's start and
    the imports (the driver's, and the forkserver's preload), which job 1 never pays."""
    cpu0, cpu1 = (read_summary(multirun / job)["startup_cpu_s"] for job in ("0", "1"))
    assert 0 < cpu1["driver"] < cpu0["driver"], (cpu0, cpu1)
    assert 0 <= cpu1["forkserver"] < cpu0["forkserver"], (cpu0, cpu1)
    assert cpu1["workers"] > 0


def test_runs_log_watchdog_health_to_tensorboard(multirun):
    from rlpipe.report.jobs import load_job

    tags = set(load_job(multirun / "0").scalars)
    assert {"health/worker_restarts", "health/workers_being_replaced"} <= tags


def test_killed_job_and_killed_run_reports(multirun, tmp_path, capsys):
    """A job without summary.json (killed with -9) still gets a row from its TensorBoard
    scalars, and its own health report is rebuilt from what it left."""
    copy = tmp_path / "mr"
    shutil.copytree(multirun, copy, ignore=shutil.ignore_patterns("comparison*", "eval", "checkpoints"))
    (copy / "1" / "summary.json").unlink()
    (copy / "1" / "health_report.md").unlink()
    code, err = report_main(copy, capsys)
    assert code == 0, err
    md = (copy / "comparison.md").read_text()
    killed = next(line for line in md.splitlines() if line.startswith("| [1]"))
    assert "no summary" in killed and "15,0" in killed  # env steps from TensorBoard
    assert "job 1: no summary.json" in md

    code, err = report_main(copy / "1", capsys)
    assert code == 0, err
    assert "summary.json" in (copy / "1" / "health_report.md").read_text()


def test_neither_run_nor_multirun_is_one_clear_error(tmp_path, capsys):
    code, err = report_main(tmp_path, capsys)
    assert code == 2
    assert "neither a run directory" in err and "Traceback" not in err


# A report whose memory plot is stopped half-written: the child writes part of the PNG through
# atomic_write, then signals itself; the handler must remove that temporary file and leave.
HALF_WRITTEN = """
import os, sys, time
import rlpipe.telemetry.health as health
from rlpipe.files import atomic_write
from rlpipe.report.__main__ import main

def half(f):
    f.write(b"half a PNG")
    f.flush()
    os.kill(os.getpid(), int(sys.argv[2]))
    time.sleep(30)

health.plot_memory = lambda _scalars, path: atomic_write(path, half)
sys.exit(main([sys.argv[1]]))
"""


def test_a_stopped_report_says_so_in_one_line_and_leaves_only_whole_files(multirun, short_tmp):
    """SIGTERM (SIGINT takes the same handler: tests/test_eval.py sends both) while the memory
    plot is half-written: one line and the signal's exit code, no traceback; that plot's
    temporary file removed and the earlier plot as it was, the plots drawn before it whole
    PNGs, the earlier report's markdown as it was."""
    sig = signal.SIGTERM
    run = short_tmp / "run"
    shutil.copytree(multirun / "0", run)
    earlier = {name: (run / name).read_bytes() for name in ("health_report.md", "health_memory.png")}
    out = subprocess.run(
        [sys.executable, "-c", HALF_WRITTEN, str(run), str(int(sig))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 128 + sig, out.stderr[-3000:]
    assert out.stderr.strip() == (
        f"rlpipe.report: stopped by {sig.name} before it finished: each file it wrote is whole, "
        "the others are an earlier report's"
    )
    assert {name: (run / name).read_bytes() for name in earlier} == earlier
    for png in run.glob("health_*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC, png
    assert [p.name for p in run.rglob("*.tmp")] == []
