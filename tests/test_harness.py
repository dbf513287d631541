"""The env harness (rlpipe/envs/harness.py): one StepTimeout that no env can swallow, the
contract on every step, and the probe that measures random returns stepping through it."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import numpy as np
import pytest

from rlpipe.envs import harness
from rlpipe.envs.contract import ContractViolation, EnvSpec
from rlpipe.envs.random_return import play_random

SPEC = EnvSpec(obs={"vector": ((3,), "float32")}, action_kind="discrete", action_n=2)
NODE = {"_target_": "test_harness.ProbeEnv", "_partial_": True}


class ProbeEnv:
    """Episodes of 5 steps with reward 1, except: a step that waits (`hang`, swallowing every
    Exception on the way, as careless env code does) or one whose obs breaks the contract
    (`bad_obs`); the first build of the probe's env misbehaves, its rebuilds do not."""

    builds = 0
    mode = "hang"

    def __init__(self, env_id: int, seed: int):
        ProbeEnv.builds += 1
        self.broken = ProbeEnv.builds == 1
        self.t = 0

    @classmethod
    def describe(cls) -> EnvSpec:
        return SPEC

    def reset(self, env_id):
        self.t = 0
        return {"vector": np.zeros(3, np.float32)}

    def step(self, env_id, action):
        self.t += 1
        obs = {"vector": np.zeros(3, np.float32)}
        if self.broken and self.t == 2:
            if ProbeEnv.mode == "hang":  # 3 s, retried through any Exception
                until = time.monotonic() + 3.0
                while time.monotonic() < until:
                    try:
                        time.sleep(until - time.monotonic())
                    except Exception:
                        pass
            else:
                obs = {"vector": np.zeros(4, np.float32)}
        return obs, 1.0, self.t >= 5, False, {}

    def close(self, env_id):
        pass


@pytest.fixture
def probe():
    ProbeEnv.builds = 0
    yield ProbeEnv
    ProbeEnv.mode = "hang"


def test_one_step_timeout_in_the_package_and_it_is_a_base_exception():
    package = Path(harness.__file__).resolve().parents[1]
    defined = [
        str(path.relative_to(package.parent))
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and "steptimeout" in node.name.lower()
    ]
    assert defined == ["rlpipe/envs/harness.py"], defined
    assert not issubclass(harness.StepTimeout, Exception)
    assert harness.StepTimeout in harness.CUTS and Exception in harness.CUTS


def test_an_env_cannot_swallow_the_alarm_deadline(probe):
    env = harness.build(probe, 0, 0)
    harness.reset(SPEC, env, 0)
    alarm = harness.AlarmDeadline(0.2)
    try:
        harness.step(SPEC, env, 0, 0, alarm)
        t0 = time.monotonic()
        with pytest.raises(harness.StepTimeout):
            harness.step(SPEC, env, 0, 0, alarm)
        assert time.monotonic() - t0 < 2.0
    finally:
        alarm.close()


def test_harness_step_checks_the_contract(probe):
    probe.mode = "bad_obs"
    env = harness.build(probe, 0, 0)
    harness.reset(SPEC, env, 0)
    harness.step(SPEC, env, 0, 0)
    with pytest.raises(ContractViolation):
        harness.step(SPEC, env, 0, 0)


@pytest.mark.parametrize("mode", ["hang", "bad_obs"])
def test_random_return_probe_cuts_the_episode_and_rebuilds(probe, mode):
    """A hang (its env swallowing Exceptions) and a contract break each cut the first episode;
    the rebuilt env's episodes count (return 5 each)."""
    probe.mode = mode
    t0 = time.monotonic()
    result = play_random(NODE, episodes=3, budget_s=20.0, seed=0, step_timeout_s=0.3)
    assert result == {"mean": 5.0, "std": 0.0, "episodes": 3}
    assert probe.builds == 2  # the broken env and its rebuild
    assert time.monotonic() - t0 < 2.5  # the hang was cut at its deadline, not waited out
