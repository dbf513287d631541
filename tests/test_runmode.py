"""The run modes the driver holds (rlpipe.supervisor.runmode): a single process decides on its
own clock and counters, a torchrun rank asks for what the next update round decides. The
whole path under torchrun runs in tests/test_dist.py."""

from __future__ import annotations

import re
from types import SimpleNamespace

from conftest import compose_cfg
from rlpipe.config import run_spec
from rlpipe.ranks import RankInfo
from rlpipe.supervisor.runmode import Solo

OVERRIDES = [
    "env_mix=cartpole",
    "env_count=8",
    "learner.update_envs=4",
    "run.duration_s=30",
    "run.total_env_steps=1000",
]


class Timer:
    """cadence.Every as the checkpoint calls read it: due() resets, passed() does not."""

    def __init__(self, passed: bool):
        self.is_passed, self.due_calls = passed, 0

    def due(self, now):
        self.due_calls += 1
        return self.is_passed

    def passed(self, now):
        return self.is_passed


def _learner(env_steps=0, updates=1, random=False):
    return SimpleNamespace(
        counters=SimpleNamespace(env_steps=env_steps, updates=updates),
        random=random,
        want_stop=False,
        finished=False,
        checkpoint_wanted=False,
    )


def test_solo_stops_on_its_own_step_count_or_clock_and_checkpoints_on_its_clock(tmp_path):
    solo = Solo(run_spec(compose_cfg(OVERRIDES)))
    assert solo.start(tmp_path) == tmp_path and solo.writes_job_outputs and solo.line_prefix == ""
    assert not solo.should_stop(_learner(env_steps=999), elapsed_s=29.9)
    assert solo.should_stop(_learner(env_steps=1000), elapsed_s=1.0)
    assert solo.should_stop(_learner(env_steps=0), elapsed_s=30.0)
    assert not solo.checkpoint_after_update(_learner())
    assert solo.checkpoint_on_clock(_learner(), Timer(passed=True), 0.0)
    assert not solo.checkpoint_on_clock(_learner(), Timer(passed=False), 0.0)
    # nothing to save before the first update, nor for random actions; the clock is not consumed
    timer = Timer(passed=True)
    assert not solo.checkpoint_on_clock(_learner(updates=0), timer, 0.0)
    assert not solo.checkpoint_on_clock(_learner(random=True), timer, 0.0)
    assert timer.due_calls == 0
    assert solo.summary_section() == {"world_size": 1, "params_in_sync": None}
    assert solo.redis_fields() == {} and re.fullmatch(r"\d+-[0-9a-f]{6}", solo.new_run_id())


def test_a_rank_asks_the_next_round_to_stop_and_to_checkpoint():
    from rlpipe.ranks.run import Ranks

    spec = run_spec(compose_cfg(OVERRIDES))
    rank = Ranks(RankInfo(1, 2, 1, "job", 0), spec)  # no process group: nothing collective here
    assert (rank.spec.env_count, rank.spec.env_id_offset) == (4, 4)
    assert not rank.writes_job_outputs and rank.line_prefix == "rank 1/2 "
    assert Ranks(RankInfo(0, 2, 0, "job", 0), spec).writes_job_outputs
    assert rank.redis_fields() == {"job": "job", "rank": 1, "world_size": 2, "env_id_offset": 4}
    assert re.fullmatch(r"\d+-[0-9a-f]{6}r1", rank.new_run_id())
    learner = _learner(env_steps=10**6)  # past total_env_steps: the round decides
    assert not rank.should_stop(learner, elapsed_s=10.0) and not learner.want_stop
    assert not rank.should_stop(learner, elapsed_s=30.0) and learner.want_stop  # asked, not yet agreed
    learner.finished = True
    assert rank.should_stop(learner, elapsed_s=0.0)
    assert not rank.checkpoint_on_clock(learner, Timer(passed=True), 0.0) and learner.checkpoint_wanted
    assert not rank.checkpoint_on_clock(learner, Timer(passed=False), 0.0) and not learner.checkpoint_wanted
    learner.take_checkpoint = lambda: True  # the round agreed: every rank saves now
    assert rank.checkpoint_after_update(learner)
    section = rank.summary_section()
    assert (section["world_size"], section["rank"], section["params_in_sync"]) == (2, 1, None)
