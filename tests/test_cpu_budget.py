"""benchmarks/cpu_budget.py's arithmetic: each process's CPU time between two readings goes to
its role (a process that did not live through both counts for nothing), divided by the
window and by the rate; each CPU's idle share; the ceiling is the CPUs over the summed cost.
The run and the readings themselves are the engine's and /proc's (the script runs them). A
window that would end after the run, or a mode engine_sps.py does not run, is refused by its
flag before anything starts."""

from __future__ import annotations

import subprocess
import sys
from collections import namedtuple

import pytest

from conftest import REPO, load_benchmark

Times = namedtuple("Times", "user system idle")


def test_cpu_time_goes_to_roles_per_unit_and_the_ceiling_is_cpus_over_the_cost(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    cpu_budget = load_benchmark("cpu_budget")
    before = {10: ("driver", 5.0), 11: ("update", 1.0), 12: ("workers", 2.0), 13: ("workers", 0.0)}
    after = {10: ("driver", 6.0), 11: ("update", 5.0), 12: ("workers", 6.0), 13: ("workers", 4.0), 14: ("other", 9.0)}
    idle_before = [Times(0, 0, 0), Times(0, 0, 0)]
    idle_after = [Times(9, 0, 1), Times(8, 0, 2)]  # 10 % and 20 % idle
    out = cpu_budget.budget(before, after, idle_before, idle_after, seconds=10.0, rate=100_000.0)
    assert out["cpus_used"] == pytest.approx({"driver": 0.1, "update": 0.4, "workers": 0.8, "other": 0.0})
    assert out["us_per_unit"] == pytest.approx({"driver": 1.0, "update": 4.0, "workers": 8.0, "other": 0.0})
    assert out["idle"] == pytest.approx([0.1, 0.2])
    assert out["us_total"] == pytest.approx(13.0)
    assert out["ceiling_per_s"] == pytest.approx(2 / 13e-6)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--warmup", "50", "--seconds", "60"], "--warmup 50 + --window 20 must end before the run does"),
        (["--mode", "hodl"], "--mode: 'hodl' is not random, nor hold or drop"),
    ],
)
def test_a_window_past_the_run_or_an_unknown_mode_is_refused_by_name(args, says):
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "cpu_budget.py"), *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr
