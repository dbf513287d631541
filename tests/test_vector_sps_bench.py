"""benchmarks/vector_sps.py: its rlpipe rows and survival trial work (tiny, slow-marked: the
script's figures are printed, never asserted on timing); the issue's 10-minute fault run
(1,000 CartPoles, each raising once every 10,000 of its steps, one blocking forever once)
keeps every env stepping through both of rlpipe.vector's forms."""

from __future__ import annotations

import os

import pytest

from conftest import load_benchmark


@pytest.mark.slow
def test_the_benchmark_measures_and_runs_a_survival_trial():
    bench = load_benchmark("vector_sps")
    row = bench.sps("rlpipe_async", 4, 0.5)
    assert row["envs"] == 4 and row["sps"] > 0
    res = bench.trial("rlpipe_sync", 4, 3.0, 5.0)
    assert res["outcome"] == "survived", res


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the run's 600 s, its start and close
@pytest.mark.parametrize("backend", ["rlpipe_sync", "rlpipe_async"])
def test_ten_minutes_of_faults_over_1000_envs_keep_every_env_stepping(backend):
    seconds = float(os.environ.get("RLPIPE_FAULT_RUN_S", "600"))
    res = load_benchmark("vector_sps").trial(backend, 1000, seconds, 30.0)
    print(res)
    assert res["outcome"] == "survived", res
    assert res["every_env_stepped_in_last_tenth"] and res["faults_reported"] > 0, res
