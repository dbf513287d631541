"""rlpipe.vector: a gymnasium VectorEnv over rlpipe's real workers (no mocks): its spaces and
API, step-for-step agreement with SyncVectorEnv, faults as data, the async form, wrong calls,
and that close (or SIGTERM) leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

import rlpipe.vector as rv
from rlpipe.lifecycle.readers import fault_counts
from rlpipe.lifecycle.recovery import restart_reasons

REPO = Path(__file__).resolve().parent.parent
BREAKING = "vector_envs:Breaking-v0"


def leftovers(run_id: str) -> list[str]:
    return [str(p) for p in Path("/dev/shm").glob(f"rlpipe_{run_id}_*")] + [
        str(p) for p in Path("/tmp").glob(f"rlpipe_{run_id}")
    ]


def engine_pids(envs) -> list[int]:
    """The vector's worker processes and its embedded redis-server."""
    pids = [h.proc.pid for h in envs.engine.core.fleet.handles if h.proc is not None]
    redis = envs.engine.core.services.redis
    proc = getattr(redis, "proc", None)
    if proc is not None:
        pids.append(proc.pid)
    return pids


def test_is_a_gymnasium_vector_env_with_the_ids_spaces():
    envs = rv.make("CartPole-v1", 5, seed=7)
    try:
        assert isinstance(envs, VectorEnv)
        ref = gym.make("CartPole-v1")
        assert envs.single_observation_space == ref.observation_space
        assert envs.single_action_space == ref.action_space
        assert envs.observation_space == gym.vector.utils.batch_space(ref.observation_space, 5)
        assert envs.action_space == gym.spaces.MultiDiscrete([2] * 5)
        assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert envs.np_random_seed == tuple(7 + i for i in range(5))
        obs, info = envs.reset()
        assert obs in envs.observation_space and info == {}
        for _ in range(20):
            obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
            assert obs in envs.observation_space  # check_env-style, every step
            assert rew.dtype == np.float64 and term.dtype == trunc.dtype == np.bool_
            assert rew.shape == term.shape == trunc.shape == (5,)
        ref.close()
    finally:
        envs.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_autoreset_matches_sync_vector_env_same_step_step_for_step(threads):
    """Seeded CartPole with a 30-step limit (terminations and truncations both happen): obs,
    rewards, flags, final obs and their masks equal SyncVectorEnv(SAME_STEP)'s at every step,
    through the worker's C step loop (1 thread) and its thread pool (2)."""
    n, seed = 6, 42
    envs = rv.make(
        "CartPole-v1",
        n,
        seed=seed,
        overrides=["+env_mix.types.gym.make_kwargs.max_episode_steps=30", f"worker.threads={threads}"],
    )
    sync = SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=30) for _ in range(n)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    try:
        o1, _ = envs.reset(seed=seed)
        o2, _ = sync.reset(seed=seed)
        np.testing.assert_array_equal(o1, o2)
        rng = np.random.default_rng(0)
        ends = {"term": 0, "trunc": 0}
        for t in range(200):
            a = rng.integers(0, 2, n)
            s1, s2 = envs.step(a), sync.step(a)
            for x, y in zip(s1[:4], s2[:4]):
                np.testing.assert_array_equal(x, y, err_msg=f"step {t}")
            i1, i2 = s1[4], s2[4]
            assert ("final_obs" in i1) == ("final_obs" in i2), t
            if "final_obs" in i2:
                np.testing.assert_array_equal(i1["_final_obs"], i2["_final_obs"])
                for j in np.flatnonzero(i2["_final_obs"]):
                    np.testing.assert_array_equal(i1["final_obs"][j], i2["final_obs"][j])
            ends["term"] += int(s2[2].sum())
            ends["trunc"] += int(s2[3].sum())
        assert ends["term"] > 10 and ends["trunc"] > 0, ends
    finally:
        envs.close()
        sync.close()


def test_wrong_calls_raise_clear_errors():
    envs = rv.make("CartPole-v1", 3)
    try:
        with pytest.raises(RuntimeError, match="before reset"):
            envs.step(np.zeros(3, np.int64))
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"shape \(2,\), expected \(3,\)"):
            envs.step(np.zeros(2, np.int64))
        with pytest.raises(TypeError, match="scalar"):
            envs.step(0)
        with pytest.raises(ValueError, match="outside Discrete"):
            envs.step(np.array([0, 1, 2]))
        with pytest.raises(TypeError, match="seed must be an int"):
            envs.reset(seed="x")
        with pytest.raises(ValueError, match="seed must be an int from 0 to 4294967295"):
            envs.reset(seed=-1)  # SyncVectorEnv's envs refuse it too (Gymnasium's seeding)
        envs.step(np.array([0, 1, 1]))  # the vector is fine after refused calls
    finally:
        envs.close()
    with pytest.raises(rv.ClosedError):
        envs.step(np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="num_envs"):
        rv.make("CartPole-v1", 0)


def test_close_frees_processes_segments_sockets_redis_and_run_dir():
    envs = rv.make("CartPole-v1", 4, overrides=["groups.size=2"])
    envs.reset(seed=1)
    envs.step(envs.action_space.sample())
    run_id, run_dir = envs.engine.run_id, envs.run_dir
    pids = engine_pids(envs)
    assert len(pids) >= 3 and leftovers(run_id)  # two workers and Redis; their segments
    envs.close()
    envs.close()  # a second close does nothing
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    assert leftovers(run_id) == [] and not run_dir.exists()


SIGTERM_SCRIPT = """
import sys, time
import rlpipe.vector as rv
envs = rv.make("CartPole-v1", 4, overrides=["groups.size=2"])
envs.reset(seed=0)
envs.step(envs.action_space.sample())
pids = [h.proc.pid for h in envs.engine.core.fleet.handles] + [envs.engine.core.services.redis.proc.pid]
print(envs.engine.run_id, envs.run_dir, *pids, flush=True)
time.sleep(120)
"""


def test_sigterm_closes_the_vector(tmp_path):
    """A learner's script without a __main__ guard, ended by SIGTERM: its vector's workers,
    Redis, segments, sockets and temp dirs go with it."""
    script = tmp_path / "learner.py"
    script.write_text(SIGTERM_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline().split()
        assert line, proc.stderr.read()[-3000:]
        run_id, run_dir, pids = line[0], Path(line[1]), [int(p) for p in line[2:]]
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in pids)
    assert leftovers(run_id) == [] and not run_dir.exists()
    assert not list(Path("/tmp").glob(f"rlpipe_{run_id}_mp"))


def _fault_rows(info) -> dict[int, str]:
    if "rlpipe_fault" not in info:
        return {}
    f = info["rlpipe_fault"]
    return {int(j): f["kind"][j] for j in np.flatnonzero(info["_rlpipe_fault"])}


@pytest.mark.parametrize(
    "param,kind,error_type", [("crash_at", "crash", "RuntimeError"), ("nan_at", "contract", "ContractViolation")]
)
def test_crash_and_contract_break_are_truncations_with_a_fault_info(param, kind, error_type, short_tmp):
    """Envs 0..3 crash (or return NaN) at the 4th step of every episode: the vector never
    raises, that step reports them truncated with the fault's kind and fingerprint and no end
    obs, and the rebuilt envs step on (and break again 4 steps later)."""
    run_dir = short_tmp / "run"
    envs = rv.make(BREAKING, 4, overrides=[f"+env_mix.types.gym.make_kwargs.{param}=4"], run_dir=run_dir)
    try:
        envs.reset(seed=0)
        seen = []
        for t in range(1, 14):
            obs, rew, term, trunc, info = envs.step(np.zeros(4, np.int64))
            faults = _fault_rows(info)
            if faults:
                assert set(faults) == {0, 1, 2, 3}
                assert trunc.all() and not term.any() and not rew.any()
                assert "final_obs" not in info or not info["_final_obs"].any()  # a cut has no end obs
                f = info["rlpipe_fault"]
                assert all(f["fingerprint"][j] for j in faults)
                assert len(set(f["fingerprint"][j] for j in faults)) == 1  # one cause, one hash
                seen.append((t, faults[0], f["error_type"][0]))
            else:
                assert obs[0, 0] == (t % 4)  # the rebuilt env counts from its reset
        assert seen == [(4, kind, error_type), (8, kind, error_type), (12, kind, error_type)], seen
        assert envs.fault_count == 4 * len(seen)
    finally:
        envs.close()
    # the run's lifecycle log has them too, as a training run's would (a given run_dir stays)
    counts = fault_counts(run_dir / "lifecycle.sqlite")
    assert counts["env_rebuilds"] == 12
    assert counts["env_crashes" if kind == "crash" else "quarantined"] == 12


def test_a_hung_env_is_cut_at_the_deadline_and_its_neighbours_go_on():
    envs = rv.make(
        BREAKING,
        2,
        overrides=["+env_mix.types.gym.make_kwargs.hang_at=3", "worker.step_timeout_s=0.5", "groups.size=1"],
    )
    try:
        envs.reset(seed=0)
        t0 = time.monotonic()
        kinds = []
        for _ in range(4):
            *_, trunc, info = envs.step(np.zeros(2, np.int64))
            kinds.append(_fault_rows(info))
        assert kinds[2] == {0: "hang", 1: "hang"} and kinds[3] == {}
        assert time.monotonic() - t0 < 10
    finally:
        envs.close()


def test_a_killed_worker_is_replaced_and_its_envs_report_truncated(short_tmp):
    envs = rv.make("CartPole-v1", 4, seed=0, overrides=["groups.size=2"], run_dir=short_tmp / "run")
    try:
        envs.reset()
        envs.step(envs.action_space.sample())
        victim = envs.engine.core.fleet.handles[1]
        old_pid = victim.proc.pid
        os.kill(old_pid, signal.SIGKILL)
        obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
        assert _fault_rows(info) == {2: "worker_restart", 3: "worker_restart"}
        assert trunc[2:].all() and not trunc[:2].any()
        assert obs in envs.observation_space
        assert victim.proc.pid != old_pid and victim.proc.is_alive()
        for _ in range(5):
            *_, info = envs.step(envs.action_space.sample())
            assert _fault_rows(info) == {}
    finally:
        envs.close()
    assert restart_reasons(short_tmp / "run" / "lifecycle.sqlite") == {"exited": 1}


def test_send_recv_returns_ready_envs_with_their_ids():
    """EnvPool's async form: recv hands out at least batch_size envs (whole slices) with ids;
    send takes their actions; every env keeps stepping, the fast workers' without waiting for
    the slow ones (four workers start one after another on a busy machine)."""
    n = 8
    envs = rv.make("CartPole-v1", n, seed=0, batch_size=2, overrides=["groups.size=2"])
    try:
        envs.async_reset()
        steps = np.zeros(n, np.int64)
        deadline = time.monotonic() + 60
        while steps.min() < 3 and time.monotonic() < deadline:
            obs, rew, term, trunc, info = envs.recv()
            ids = info["env_id"]
            assert len(ids) >= 2 and len(set(ids.tolist())) == len(ids)
            assert obs.shape == (len(ids), 4) and rew.shape == (len(ids),)
            steps[ids] += 1
            envs.send(np.zeros(len(ids), np.int64), ids)
        assert steps.min() >= 3, steps
        with pytest.raises(ValueError, match="whole slices"):
            obs, *_, info = envs.recv()
            envs.send(np.zeros(1, np.int64), info["env_id"][:1])
    finally:
        envs.close()


def test_an_rlpipe_env_type_by_name():
    envs = rv.make("web_sim", 3, seed=0)
    try:
        assert envs.single_observation_space.shape == (16,)
        assert envs.single_action_space == gym.spaces.Discrete(5)
        obs, _ = envs.reset()
        for _ in range(5):
            obs, *_ = envs.step(envs.action_space.sample())
            assert obs in envs.observation_space
    finally:
        envs.close()


def test_a_continuous_box_action_id_matches_sync_vector_env():
    """Pendulum's Box(-2, 2) actions go through the continuous head (mapped onto [-1, 1] and
    back) and come out as SyncVectorEnv's, to float32 rounding."""
    n = 3
    envs = rv.make("Pendulum-v1", n, seed=5)
    sync = SyncVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        assert envs.single_action_space == sync.single_action_space
        np.testing.assert_array_equal(envs.reset(seed=5)[0], sync.reset(seed=5)[0])
        rng = np.random.default_rng(1)
        for _ in range(50):
            a = rng.uniform(-2, 2, (n, 1)).astype(np.float32)
            o1, r1, *_ = envs.step(a)
            o2, r2, *_ = sync.step(a)
            np.testing.assert_allclose(o1, o2, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(r1, r2, rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="NaN"):
            envs.step(np.full((n, 1), np.nan, np.float32))
    finally:
        envs.close()
        sync.close()


def test_a_type_with_rgb_obs_renders_its_frames():
    envs = rv.make(
        "faulty",
        2,
        seed=0,
        overrides=[
            f"env_mix.types.faulty.{k}=0"
            for k in ("reset_error_rate", "step_error_rate", "render_error_rate", "violation_rate")
        ],
    )
    try:
        assert envs.render_mode == "rgb_array"
        assert set(envs.single_observation_space.spaces) == {"state", "rgb"}
        obs, _ = envs.reset()
        frames = envs.render()
        assert len(frames) == 2 and frames[0].shape == envs.single_observation_space["rgb"].shape
        np.testing.assert_array_equal(frames[1], obs["rgb"][1])
        obs, *_ = envs.step(envs.action_space.sample())
        assert obs in envs.observation_space
    finally:
        envs.close()
    cart = rv.make("CartPole-v1", 1)
    try:
        assert cart.render_mode is None and cart.render() is None
    finally:
        cart.close()


def test_a_type_that_cannot_be_built_is_a_clear_error_not_a_hang():
    envs = rv.make(
        "faulty", 2, overrides=["env_mix.types.faulty.reset_error_rate=1.0", "env_mix.types.faulty.rgb_shape=null"]
    )
    try:
        with pytest.raises(
            RuntimeError,
            match=r"replaced 6 times without building its envs; last error: "
            r"\w+: .*reset",
        ):
            envs.reset()
    finally:
        envs.close()


def test_the_vector_keeps_no_cpu_for_a_learner_it_does_not_run():
    """cpu_affinity=auto would keep a CPU for rlpipe's PPO thread; a vector's learner is the
    caller's, so its workers get every CPU unless the caller asks otherwise."""
    from rlpipe.vector.compose import vector_spec

    assert "workers on every CPU" in vector_spec("CartPole-v1", 7000, None, []).layout.describe()
    pinned = vector_spec("CartPole-v1", 64, None, ["worker.cpu_affinity=learner_core"])
    assert "kept for the PPO update" in pinned.layout.describe()


@pytest.mark.parametrize(
    "override, said",
    [
        ("env_count=5", "sets env_count, which the vector sets from make()'s num_envs argument"),
        ("run.seed=5", "sets run.seed, which the vector sets from make()'s seed argument"),
        ("env_mix=classic", "sets env_mix, which the vector sets from make()'s env id"),
        ("learner.nope=1", "Unknown config key learner.nope"),  # Hydra's refusal, as the CLI says it
        ("+learner.nope=1", "Unknown config key learner.nope"),  # let in by Hydra, refused as the CLI does
        ("env_count=abc", "sets env_count"),
        ("worker.slices=often", "Invalid config value worker.slices='often'"),
    ],
)
def test_overrides_are_checked_as_the_cli_checks_them_and_may_not_contradict_make(override, said):
    """Before, env_count=5 failed later with numpy's "could not broadcast" and +learner.nope=1
    was accepted and read by nothing."""
    from rlpipe.config import ConfigError
    from rlpipe.vector.compose import vector_spec

    with pytest.raises(ConfigError) as caught:
        vector_spec("CartPole-v1", 2, None, [override])
    assert said in str(caught.value), str(caught.value)
    assert vector_spec("CartPole-v1", 2, None, ["worker.slices=1"]).worker.slices == 1
