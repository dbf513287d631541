"""One policy over many env types: the type-aware network, PopArt, per-type advantages, reward
normalization that keeps the optimal policy, and GAE targets (termination, time-limit
truncation with the final obs's value, an env rebuild's cut) against plain reference loops."""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest
import torch

from conftest import compose_cfg, ppo_batch
from rlpipe.config import ObsKey, run_spec
from rlpipe.envs.contract import EnvSpec
from rlpipe.envs.registry import ActionSpace, MixPlan, plan_mix
from rlpipe.learner.backlog import DROP_KEEPS_BATCHES
from rlpipe.learner.central import CentralLearner
from rlpipe.learner.policy import Policy, TypeOrder
from rlpipe.learner.popart import PopArt
from rlpipe.learner.ppo import _split_sizes, normalize_per_type
from rlpipe.learner.rollout import SliceRollout
from rlpipe.learner.rollout_store import RolloutStore
from rlpipe.protocol import Round
from rlpipe.worker.rewardnorm import RewardNormalizer

STATE = ObsKey("state", (6,), "float32")


def _plan(n_per_type: int = 16) -> MixPlan:
    specs = (
        EnvSpec({"state": ((4,), "float32")}, "discrete", 2),
        EnvSpec({"state": ((6,), "float32")}, "discrete", 3),
        EnvSpec({"state": ((3,), "float32")}, "continuous", 1),
    )
    env_type = np.tile(np.arange(3, dtype=np.int16), n_per_type)
    return MixPlan(("a", "b", "c"), specs, env_type, ActionSpace(3, 1), (STATE,))


def _policy(seed: int = 0) -> Policy:
    torch.manual_seed(seed)
    return Policy(_plan(), (STATE,), (16, 16)).double()


def _batch(n: int = 60, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    types = torch.randint(0, 3, (n,), generator=g)
    return {"state": torch.randn(n, 6, generator=g, dtype=torch.float64)}, types


# -- the type-aware network ------------------------------------------------------------------------


def test_type_order_sorts_and_restores_rows():
    types = torch.tensor([2, 0, 2, 1, 0, 0, 2])
    order = TypeOrder.of(types)
    assert order.segments == ((0, 0, 3), (1, 3, 4), (2, 4, 7))
    x = torch.arange(7)
    assert torch.equal(order.types, order.sort(types)) and torch.equal(order.unsort(order.sort(x)), x)
    one = TypeOrder.of(torch.tensor([1, 1, 1]))
    assert one.perm is None and one.segments == ((1, 0, 3),)


def test_each_type_reads_only_its_own_weights():
    """A batched forward equals each row run alone, and changing one type's input and output
    layers changes no other type's value or actions."""
    policy = _policy()
    obs, types = _batch()
    logits, mean = policy.dist_params(obs, types)
    value = policy.value(obs, types)
    for i in range(0, len(types), 7):  # row by row: the same numbers
        lg, mn = policy.dist_params({"state": obs["state"][i : i + 1]}, types[i : i + 1])
        torch.testing.assert_close(lg[0], logits[i])
        torch.testing.assert_close(mn[0], mean[i])
        torch.testing.assert_close(policy.value({"state": obs["state"][i : i + 1]}, types[i : i + 1])[0], value[i])
    with torch.no_grad():
        for tower in (policy.critic, policy.actor_disc, policy.actor_cont):
            tower.inp.weight[1].add_(1.0)
            tower.out.bias[1].add_(3.0)
    logits2, mean2 = policy.dist_params(obs, types)
    value2 = policy.value(obs, types)
    other, mine = types != 1, types == 1
    assert torch.equal(logits2[other], logits[other]) and torch.equal(value2[other], value[other])
    assert torch.equal(mean2[other], mean[other])
    assert not torch.allclose(value2[mine], value[mine])


def test_deterministic_act_is_the_mode():
    policy = _policy()
    obs, types = _batch()
    a_disc, a_cont, _, _ = policy.act(obs, types, deterministic=True)
    logits, mean = policy.dist_params(obs, types)
    assert torch.equal(a_disc, logits.argmax(-1))
    assert torch.equal(a_cont, mean)


# -- PopArt ----------------------------------------------------------------------------------------


def test_popart_preserves_outputs_when_statistics_move():
    policy = _policy()
    obs, types = _batch(90)
    before = policy.value(obs, types)
    rng = np.random.default_rng(0)
    scale = torch.tensor([1.0, 100.0, 1e4], dtype=torch.float64)
    for _ in range(5):  # returns on three very different scales
        rets = torch.from_numpy(rng.normal(50, 20, len(types))) * scale[types]
        policy.popart.update(rets, types, 3e-4, policy.critic.out)
        torch.testing.assert_close(policy.value(obs, types), before, rtol=1e-9, atol=1e-9)
    assert policy.popart.sigma[2] > 1e4 * policy.popart.sigma[0] / 10  # they did move apart
    assert not torch.equal(policy.popart.mu, torch.zeros(3, dtype=torch.float64))


def test_popart_statistics_are_per_type_and_debiased():
    rng = np.random.default_rng(1)
    a = torch.from_numpy(rng.normal(3.0, 2.0, 400))
    b = torch.from_numpy(rng.normal(-500.0, 80.0, 300))
    mixed, alone = PopArt(3), PopArt(3)
    layer = Policy(_plan(), (STATE,), (8,)).double().critic.out
    mixed.update(
        torch.cat([a, b]),
        torch.cat([torch.zeros(400, dtype=torch.long), torch.ones(300, dtype=torch.long)]),
        3e-4,
        layer,
    )
    alone.update(a, torch.zeros(400, dtype=torch.long), 3e-4, layer)
    # type 0's statistics do not depend on type 1's data; the first batch sets them directly
    assert mixed.mu[0] == alone.mu[0] and mixed.sigma[0] == alone.sigma[0]
    assert mixed.mu[0].item() == pytest.approx(a.mean().item(), rel=1e-12)
    assert mixed.sigma[0].item() == pytest.approx(a.std(unbiased=False).item(), rel=1e-9)
    assert mixed.mu[1].item() == pytest.approx(b.mean().item(), rel=1e-12)
    assert mixed.mu[2] == 0 and mixed.sigma[2] == 1  # unseen type untouched


def test_advantages_normalized_per_type_and_every_sample_trained():
    rng = np.random.default_rng(2)
    types = torch.from_numpy(rng.integers(0, 3, 500))
    adv = torch.from_numpy(rng.normal(0, 1, 500)) * torch.tensor([1.0, 100.0, 0.01])[types] + 7
    out = normalize_per_type(adv, types, 3)
    for t in range(3):
        sel = out[types == t]
        assert sel.mean().abs() < 1e-9 and sel.std().item() == pytest.approx(1.0, rel=1e-5)
    # ppo_update cuts one permutation per epoch into ceil(n / minibatch_size) near-equal runs
    sizes = _split_sizes(1000, -(-1000 // 384))
    assert sizes == [334, 333, 333] and sum(sizes) == 1000


# -- reward normalization --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["per_env", "per_type", "global"])
def test_return_std_normalization_keeps_sign_and_order(mode):
    """A constant +1 reward (CartPole) stays positive; where envs share a statistic, larger
    rewards stay larger; the scale is the std of the discounted return, as SB3's
    VecNormalize computes it (the reference loop below)."""
    n, gamma = 4, 0.99
    types = np.array([0, 1, 0, 1])
    norm = RewardNormalizer(n, mode, clip=None, gamma=gamma, type_index=types)
    ret = np.zeros(n)
    seen: dict = {}
    rng = np.random.default_rng(3)
    for step in range(300):
        raw = np.array([1.0, 1.0, 2.0, 2.0]) if step < 100 else rng.normal(0, 5, n)
        done = np.zeros(n, bool) if step % 50 != 49 else np.array([True, False, True, False])
        out = norm.normalize(0, n, raw, done)
        # reference: G <- gamma G + r; statistics over G per row; r / sqrt(var + eps); reset on done
        ret = ret * gamma + raw
        rows = {"per_env": np.arange(n), "per_type": types, "global": np.zeros(n, int)}[mode]
        for i in range(n):
            seen.setdefault(rows[i], []).append(ret[i])
        expect = np.array(
            [raw[i] / (np.sqrt(np.var(seen[rows[i]]) + 1e-8) if len(seen[rows[i]]) > 1 else 1.0) for i in range(n)]
        )
        np.testing.assert_allclose(out, expect, rtol=2e-6)
        ret[done] = 0.0
        if step < 100:
            assert (out > 0).all()  # +1 and +2 stay rewards, not penalties
            if mode != "per_env":  # envs sharing a statistic keep their order
                assert out[2] > out[0] and out[3] > out[1]
    mean_std = RewardNormalizer(2, "mean_std", clip=None, gamma=0.99)
    for _ in range(50):
        shifted = mean_std.normalize(0, 2, np.array([1.0, 1.0]))
    assert (shifted == 0).all()  # the article's form removes a constant reward entirely


def test_reward_statistics_round_trip_in_every_mode():
    rng = np.random.default_rng(4)
    for mode in ("per_env", "per_type", "global", "mean_std"):
        types = np.array([3, 0, 3, 1, 0])
        a = RewardNormalizer(5, mode, clip=10.0, gamma=0.9, type_index=types)
        for _ in range(30):
            a.normalize(0, 5, rng.normal(0, 10, 5), rng.random(5) < 0.1)
        b = RewardNormalizer(5, mode, clip=10.0, gamma=0.9, type_index=types)
        b.load(a.state())
        assert b.state() == a.state()
        np.testing.assert_array_equal(b.m2, a.m2)
    with pytest.raises(ValueError, match="statistics rows"):  # another type layout
        RewardNormalizer(5, "per_type", 10.0, 0.99, type_index=np.zeros(5, int)).load(
            RewardNormalizer(5, "per_type", 10.0, 0.99, type_index=np.array([3, 0, 3, 1, 0])).state()
        )


# -- GAE targets -----------------------------------------------------------------------------------


def _reference_gae(rewards, values, next_value, terminated, truncated, boot, gamma, lam):
    """Textbook GAE, one env, written the slow way: a time-limit truncation adds
    gamma * boot[t] to its reward (boot: V(final obs), or V(s_t) for a cut) and stops the trace."""
    T = len(rewards)
    adv = np.zeros(T)
    last = 0.0
    for t in reversed(range(T)):
        done = terminated[t] or truncated[t]
        r = rewards[t] + (gamma * boot[t] if truncated[t] and not terminated[t] else 0.0)
        nv = next_value if t == T - 1 else values[t + 1]
        delta = r + gamma * nv * (1 - done) - values[t]
        last = delta + gamma * lam * (1 - done) * last
        adv[t] = last
    return adv, adv + values


def test_gae_matches_the_reference_for_termination_truncation_and_cut():
    gamma, lam, T, n = 0.97, 0.9, 12, 3
    rng = np.random.default_rng(5)
    ro = SliceRollout(n, T, (ObsKey("state", (2,), "float32"),), 1)
    rewards = rng.normal(0, 1, (T, n)).astype(np.float32)
    values = rng.normal(0, 1, (T, n)).astype(np.float32)
    terminated = np.zeros((T, n), bool)
    truncated = np.zeros((T, n), bool)
    terminated[4, 0] = True  # env 0: an episode terminates
    truncated[6, 1] = True  # env 1: a time limit, with its final obs's value
    truncated[8, 2] = True  # env 2: an env rebuild cut (no final obs)
    final_value = np.full((T, n), np.nan, np.float32)
    final_value[6, 1] = 42.0
    for t in range(T):
        if t:
            ro.add_outcome(rewards[t - 1], terminated[t - 1], truncated[t - 1], gamma, final_value[t - 1])
        ro.add_step({"state": np.zeros((n, 2), np.float32)}, np.zeros(n), np.zeros((n, 1)), np.zeros(n), values[t])
    ro.t = T  # the T-th outcome arrives with the next obs
    ro.add_outcome(rewards[T - 1], terminated[T - 1], truncated[T - 1], gamma, final_value[T - 1])
    next_value = rng.normal(0, 1, n).astype(np.float32)
    block = ro.finish(next_value, gamma, lam)
    adv = block["adv"].reshape(T, n)
    for i in range(n):
        boot = np.where(np.isnan(final_value[:, i]), values[:, i], final_value[:, i])
        ref_adv, ref_ret = _reference_gae(
            rewards[:, i].astype(np.float64),
            values[:, i].astype(np.float64),
            float(next_value[i]),
            terminated[:, i],
            truncated[:, i],
            boot,
            gamma,
            lam,
        )
        np.testing.assert_allclose(adv[:, i], ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(block["ret"].reshape(T, n)[:, i], ref_ret, rtol=1e-5, atol=1e-5)
    # the truncation bootstrapped from 42 (the final obs), not from V(s_t)
    assert adv[6, 1] == pytest.approx(rewards[6, 1] + gamma * 42.0 - values[6, 1], rel=1e-5)


def test_a_short_first_block_runs_gae_over_its_own_length_then_blocks_are_T_long():
    gamma, lam, T, first, n = 0.97, 0.9, 8, 3, 2
    rng = np.random.default_rng(9)
    ro = SliceRollout(n, T, (ObsKey("state", (2,), "float32"),), 1, first_len=first)
    rewards = rng.normal(0, 1, (first, n)).astype(np.float32)
    values = rng.normal(0, 1, (first, n)).astype(np.float32)
    for t in range(first):
        if t:
            ro.add_outcome(rewards[t - 1], np.zeros(n, bool), np.zeros(n, bool), gamma)
        assert not ro.full
        ro.add_step({"state": np.full((n, 2), t, np.float32)}, np.zeros(n), np.zeros((n, 1)), np.zeros(n), values[t])
    ro.add_outcome(rewards[first - 1], np.zeros(n, bool), np.zeros(n, bool), gamma)
    assert ro.full
    next_value = rng.normal(0, 1, n).astype(np.float32)
    block = ro.finish(next_value, gamma, lam)
    assert len(block["adv"]) == first * n and block["n_envs"] == n
    assert block["obs"]["state"][:, 0].tolist() == [0, 0, 1, 1, 2, 2]  # time-major, first rows only
    for i in range(n):
        no = np.zeros(first, bool)
        ref_adv, ref_ret = _reference_gae(
            rewards[:, i].astype(np.float64),
            values[:, i].astype(np.float64),
            float(next_value[i]),
            no,
            no,
            values[:, i],
            gamma,
            lam,
        )
        np.testing.assert_allclose(block["adv"].reshape(first, n)[:, i], ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(block["ret"].reshape(first, n)[:, i], ref_ret, rtol=1e-5, atol=1e-5)
    assert ro.length == T and ro.t == 0  # the next block is T long


def test_slices_started_together_finish_their_blocks_spread_over_T_rounds():
    """A fleet whose slices all start in one round must not finish every block in the same
    round (under backlog=hold, a burst of many updates' worth of rollouts stalls the workers
    until all of them are trained): the first block of slot k is T - k mod T long."""
    T = 16
    learner = _learner(f"learner.rollout_len={T}")
    plan, ts = learner.plan, learner.type_settings
    store = RolloutStore(plan, T, 100, ts.gamma, ts.gae_lambda, weighted=False)
    slots = np.arange(100)  # 50 workers of 2 slices, one env each here, all rung in one round
    rows = slots % len(plan.env_type)
    ones = np.ones(100, dtype=np.int64)
    rnd = Round(
        slots=slots,
        seqs=np.zeros(100, dtype=np.int64),
        starts=slots,
        counts=ones,
        rows=rows,
        types=plan.env_type[rows].astype(np.int64),
        obs={k.name: np.zeros((100,) + k.shape, dtype=k.dtype) for k in plan.obs_keys},
        results={},
        stepped=np.zeros(100, dtype=bool),
        final_rows=np.zeros(0, dtype=np.int64),
        final_obs={},
        torn_retries=0,
    )
    zeros = np.zeros(100, dtype=np.float32)
    assert store.observe(rnd, slots, ones, np.zeros((100, 1), np.float32), zeros, zeros, None) == []
    lengths = store.length[slots].tolist()
    assert lengths[:3] == [T, T - 1, T - 2]
    assert set(lengths) == set(range(1, T + 1))
    finishing = collections.Counter(lengths)  # slices whose block ends in round r (mod T)
    assert max(finishing.values()) - min(finishing.values()) <= 1  # 6 or 7 of 100 every round


# -- the learner -----------------------------------------------------------------------------------


def _learner(*overrides: str) -> CentralLearner:
    spec = run_spec(compose_cfg(["env_mix=classic", "env_count=8", "buffer=lowdim", *overrides]))
    return CentralLearner(spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing))


def test_learning_rate_anneals_by_env_steps_not_time():
    learner = _learner("run.total_env_steps=1000", "learner.learning_rate=0.01")
    assert learner.lr_now() == 0.01
    learner.counters.env_steps = 250
    assert learner.lr_now() == pytest.approx(0.0075)
    learner.counters.env_steps = 5000
    assert learner.lr_now() == pytest.approx(0.0002)  # floor: 2 % of the base
    timed = _learner("run.total_env_steps=null", "run.duration_s=60", "learner.learning_rate=0.01")
    timed.counters.env_steps = 10**9
    assert timed.lr_now() == 0.01  # duration only: constant


def test_resume_through_the_learner_is_bit_exact(tmp_path):
    """Weights, optimizer, PopArt statistics, counters and RNG streams: a learner restored
    from a checkpoint file trains on the next batch exactly as the original does."""
    from rlpipe.learner.checkpoint import load_latest, save_checkpoint
    from rlpipe.learner.ppo import ppo_update

    a = _learner()
    ppo_update(a.policy, a.optimizer, ppo_batch(a, seed=1), a.cfg, a.generator)
    a.rng.random(3)
    save_checkpoint(tmp_path, 100, a.checkpoint_payload(), keep=1)
    b = _learner("run.seed=99")  # other seeds: everything must come from the file
    b.restore(load_latest(tmp_path, validate=b.check_compatible)[1])
    for learner in (a, b):
        ppo_update(learner.policy, learner.optimizer, ppo_batch(learner, seed=2), learner.cfg, learner.generator)
    for (k, va), (_, vb) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert torch.equal(va, vb), k
    assert np.array_equal(a.rng.random(4), b.rng.random(4))
    assert torch.equal(torch.rand(3, generator=a.explore_gen), torch.rand(3, generator=b.explore_gen))


def test_resume_restores_popart_statistics_exactly():
    a = _learner()
    n = 256
    types = torch.arange(4).repeat(n // 4)
    a.policy.popart.update(torch.randn(n, dtype=torch.float64) * 100, types, 3e-4, a.policy.critic.out)
    a.counters.env_steps, a.counters.trained_samples = 1234, 999
    payload = a.checkpoint_payload()
    b = _learner()
    b.restore(payload)
    for (k, va), (_, vb) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert torch.equal(va, vb), k
    assert torch.equal(b.actor.popart.sigma, a.policy.popart.sigma)  # the serving copy too
    assert b.counters.trained_samples == 999
    assert not torch.equal(b.policy.popart.sigma, torch.ones(4, dtype=torch.float64))


def test_hold_backlog_never_lets_a_full_batch_wait_while_workers_step():
    """backlog=hold stops serving whenever a full batch waits, whether or not an update is
    running: at scale one inference round completes more rollouts than an update takes, and
    holding only during updates let untrained rollouts pile up (trained samples fell to a
    fifth of env steps at 7,000 envs)."""
    hold = _learner("learner.backlog=hold", "learner.update_envs=4")
    assert not hold.backlogged
    hold.ready_samples = hold.update_samples
    assert hold._update_job is None and hold.backlogged
    drop = _learner("learner.backlog=drop", "learner.update_envs=4")
    drop.ready_samples = 3 * drop.update_samples
    assert not drop.backlogged  # no update running: the loop starts one


def test_drop_backlog_keeps_two_full_batches_waiting_while_an_update_trains():
    """backlog=drop drops the oldest waiting blocks while an update trains, but never below
    DROP_KEEPS_BATCHES full batches: with blocks that do not divide the batch (day4: 1,120-sample
    slices against 8,192) dropping down to the batch size left 7,840 samples, and the next
    update waited for one more block instead of starting the moment the running one ended;
    one batch kept dropped 8-10 % of day4's env steps, rollouts arriving in bursts."""
    assert DROP_KEEPS_BATCHES == 2
    drop = _learner("learner.backlog=drop", "learner.update_envs=4")
    per_block = drop.update_samples * 3 // 8  # 6 blocks hold more than two batches, 5 less

    def wait(blocks: int) -> None:
        drop.ready_blocks = [{"adv": np.zeros(per_block), "n_envs": 3} for _ in range(blocks)]
        drop.ready_types = [np.zeros(per_block, dtype=np.int64) for _ in range(blocks)]
        drop.ready_samples = blocks * per_block
        drop.counters.dropped_rollouts = 0

    release = threading.Event()
    drop._update_job = threading.Thread(target=release.wait)
    drop._update_job.start()
    try:
        wait(6)
        assert not drop.backlogged and len(drop.ready_blocks) == 6  # two batches, kept whole
        assert drop.counters.dropped_rollouts == 0
        wait(10)
        assert not drop.backlogged
        assert len(drop.ready_blocks) == 6 and drop.counters.dropped_rollouts == 4 * 3  # the oldest four
        assert drop.ready_samples == 6 * per_block >= 2 * drop.update_samples
    finally:
        release.set()
        drop._update_job.join()
    drop._update_job = None
    assert drop.update_due  # the batch is there when the update ends


def test_sync_backlog_holds_the_workers_through_every_update():
    """backlog=sync: while an update trains the workers wait even with no batch waiting (every
    step then uses the newest weights); with none training, a full batch holds them as hold does
    until the loop starts its update."""
    sync = _learner("learner.backlog=sync", "learner.update_envs=4")
    assert not sync.backlogged
    sync.ready_samples = sync.update_samples
    assert sync.backlogged and sync.update_due  # the loop starts the update, then serves
    sync.ready_samples = 0
    release = threading.Event()
    sync._update_job = threading.Thread(target=release.wait)
    sync._update_job.start()
    try:
        assert sync.backlogged
        hold = _learner("learner.backlog=hold", "learner.update_envs=4")
        hold._update_job = sync._update_job
        assert not hold.backlogged  # hold steps on beside a running update
    finally:
        release.set()
        sync._update_job.join()


def test_learned_verdict_needs_random_the_start_and_enough_episodes():
    from rlpipe.envs.random_return import verdict

    rng = np.random.default_rng(6)
    rand = {"mean": 20.0, "std": 10.0, "episodes": 50}
    start = rng.normal(30, 10, 100)  # the untrained policy: already above random
    assert verdict(rng.normal(30, 10, 100), start, 5000, rand) == "did not learn"
    assert verdict(rng.normal(200, 30, 100), start, 5000, rand) == "learned"
    assert verdict(rng.normal(200, 30, 100), start, 150, rand) == "unknown"  # windows overlap
    assert verdict(rng.normal(200, 30, 100), start, 5000, None) == "unknown"


def test_the_measured_untrained_policy_is_the_start_where_there_is_one():
    """A type that ends on success: its first finished episodes are its untrained policy's best
    (-80 here), while the untrained policy plays -110 on average; last -90 learned against
    the measured start, not against the first 100."""
    from rlpipe.envs.random_return import verdict

    rng = np.random.default_rng(7)
    rand = {"mean": -150.0, "std": 50.0, "episodes": 20}
    first = rng.normal(-80, 20, 100)
    last = rng.normal(-90, 20, 100)
    untrained = {"mean": -110.0, "std": 20.0, "episodes": 20}
    assert verdict(last, first, 5000, rand) == "did not learn"
    assert verdict(last, first, 5000, rand, untrained) == "learned"
    assert verdict(last, first, 5000, rand, {"mean": -60.0, "std": 20.0, "episodes": 20}) == "did not learn"
    # no whole sample (episodes cut: the ones that finished are the short ones; a single
    # episode has no spread; none finished): the first 100 again
    assert verdict(last, first, 5000, rand, {"mean": -20.0, "std": 5.0, "episodes": 4, "cut": 16}) == "did not learn"
    assert verdict(last, first, 5000, rand, {**untrained, "cut": 0}) == "learned"
    assert verdict(last, first, 5000, rand, {"mean": -110.0, "std": None, "episodes": 1}) == "did not learn"
    assert verdict(last, first, 5000, rand, {"mean": None, "std": None, "episodes": 0}) == "did not learn"


def test_the_probe_plays_the_untrained_policy_as_the_learner_built_it(tmp_path):
    """The probe's work (`measure`, in this process: its child runs it under SCHED_IDLE): random
    returns for every type first, then the learner's own initial weights, pickled as the child
    gets them, rebuilt and played to whole episodes; a resumed run (no `initial`) writes no
    untrained figures."""
    import pickle

    from rlpipe.envs import random_return
    from rlpipe.learner.initial_return import InitialPolicy

    learner = _learner("env_count=4", "logging.initial_policy_episodes=30")  # two lockstep batches
    spec = learner.spec
    nodes = {t.name: t.node for t in spec.env_types if t.name in ("cartpole", "pendulum")}
    initial = InitialPolicy.of(learner, spec)
    rebuilt = initial.build()
    for name, value in learner.actor.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], value), name
    random_return.measure(nodes, str(tmp_path), 3, 30.0, 1, pickle.dumps(initial))
    starts = random_return.read_results(tmp_path, random_return.INITIAL_FILE)
    randoms = random_return.read_results(tmp_path)
    assert set(starts) == set(randoms) == {"cartpole", "pendulum"}
    assert randoms["cartpole"]["episodes"] == 3
    assert starts["cartpole"]["episodes"] == 30 and starts["cartpole"]["cut"] == 0
    assert 5 < starts["cartpole"]["mean"] < 100  # near-uniform logits: a few dozen steps
    assert starts["pendulum"]["mean_length"] == 200  # its time limit, every episode whole
    assert random_return.whole_sample(starts["pendulum"])
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    random_return.measure(nodes, str(resumed), 2, 30.0, 1, None)
    assert random_return.read_results(resumed) and not (resumed / random_return.INITIAL_FILE).exists()


def test_a_fresh_run_hands_its_probe_the_untrained_policy(short_tmp):
    """Through the driver: a fresh run's probe child gets the learner's initial weights
    (pickled across the forkserver) and plays them after the random figures, under SCHED_IDLE
    (the workers at normal priority); the run is stopped once the file is there (no race with
    the run's end), and summary.json and the health report carry the sample."""
    import os
    import signal
    import subprocess

    import psutil

    from conftest import REPO, driver_dies_with_pytest, read_summary, rlpipe_cmd, wait_for
    from rlpipe.envs import random_return

    run_dir = short_tmp / "run"
    cmd = rlpipe_cmd(
        run_dir,
        "env_mix=cartpole",
        "env_count=4",
        "run.duration_s=150",
        "run.total_env_steps=null",
        "logging.random_return_episodes=2",
        "logging.initial_policy_episodes=3",
    )
    err_file = short_tmp / "err.txt"  # a file, not a pipe nobody reads while the run goes on
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=driver_dies_with_pytest
        )
    policies: dict[str, set[int]] = {"idle": set(), "workers": set()}

    def sample_policies() -> None:
        """Each descendant's scheduling class, while the probe plays (it ends once done)."""
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                policy = os.sched_getscheduler(child.pid)
                worker = "rlpipe: worker" in " ".join(child.cmdline())
            except (OSError, psutil.Error):
                continue  # gone between the listing and the look
            if policy == os.SCHED_IDLE:
                policies["idle"].add(child.pid)
            if worker:
                policies["workers"].add(policy)

    def probe_done() -> dict:
        sample_policies()
        return random_return.read_results(run_dir, random_return.INITIAL_FILE)

    try:
        starts = wait_for(probe_done, 120, every_s=0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "cartpole" in starts, f"no untrained sample within 120 s:\n{err_file.read_text()[-3000:]}"
    assert proc.returncode == 128 + signal.SIGTERM, err_file.read_text()[-3000:]
    assert policies["idle"], "no descendant of the run ran under SCHED_IDLE: the probe did not"
    assert policies["workers"] == {os.SCHED_OTHER}, policies  # the forkserver's children come first
    cart = starts["cartpole"]
    assert cart["episodes"] == 3 and cart["cut"] == 0 and 5 < cart["mean"] < 100, cart
    assert read_summary(run_dir)["initial_policy_return"]["cartpole"] == pytest.approx(cart["mean"], abs=1e-3)
    assert "untrained" in (run_dir / "health_report.md").read_text()


def test_stability_weights_reach_the_ppo_loss():
    """scaling=on: a sample's weight scales its share of every loss term, so rows of weight 0
    change nothing, and one update on a batch with them equals one update without them."""
    from rlpipe.learner.ppo import ppo_update

    n = 256
    trained = []
    for drop_zero_rows in (False, True):
        learner = _learner("learner.epochs=1", f"learner.minibatch_size={n}")
        batch = ppo_batch(learner, n=n, seed=3)
        batch["weight"] = torch.where(
            batch["types"] == 0, 0.0, 0.3 + 0.7 * torch.rand(n, generator=torch.Generator().manual_seed(4))
        )
        if drop_zero_rows:
            keep = batch["types"] != 0
            batch = {
                k: ({kk: vv[keep] for kk, vv in v.items()} if isinstance(v, dict) else v[keep])
                for k, v in batch.items()
            }
        ppo_update(learner.policy, learner.optimizer, batch, learner.cfg, learner.generator)
        trained.append({k: v.clone() for k, v in learner.policy.state_dict().items()})
    with_zero, without = trained
    for k in with_zero:
        if k.startswith("popart"):
            continue  # type 0's value statistics saw its returns in one batch only
        a, b = with_zero[k], without[k]
        if k.startswith("critic.out."):
            a, b = a[1:], b[1:]  # ... so only the other types' value rows must agree
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)


def test_rollouts_store_a_key_only_for_the_envs_that_produce_it_and_the_batch_keeps_it_so():
    """SliceRollout's key_rows: rgb kept for the rgb envs of a mixed slice only, and the PPO
    batch concat_blocks makes holds those rows alone, with a mask of the samples they belong
    to: spread back over zeros (what the board holds in the other envs' rgb rows) they are the
    full storage's batch, bit for bit."""
    from rlpipe.learner.ppo import concat_blocks

    T, n = 5, 6
    keys = (ObsKey("rgb", (4, 4, 3), "uint8"), ObsKey("state", (3,), "float32"))
    rgb_envs = np.array([1, 4])
    rng = np.random.default_rng(3)
    full = SliceRollout(n, T, keys, 1)
    compact = SliceRollout(n, T, keys, 1, key_rows={"rgb": rgb_envs})
    other = SliceRollout(2, T, keys, 1)  # a block stored whole, in the same batch
    for t in range(T):
        rgb = np.zeros((n, 4, 4, 3), np.uint8)
        rgb[rgb_envs] = rng.integers(0, 255, (2, 4, 4, 3))
        obs = {"rgb": rgb, "state": rng.normal(size=(n, 3)).astype(np.float32)}
        for ro in (full, compact):
            ro.add_step(obs, np.zeros(n), np.zeros((n, 1)), np.zeros(n), np.full(n, 0.5, np.float32))
        other.add_step(
            {"rgb": rng.integers(0, 255, (2, 4, 4, 3)).astype(np.uint8), "state": np.ones((2, 3), np.float32)},
            np.zeros(2),
            np.zeros((2, 1)),
            np.zeros(2),
            np.zeros(2, np.float32),
        )
        if t:
            for ro, m in ((full, n), (compact, n), (other, 2)):
                ro.add_outcome(np.ones(m, np.float32), np.zeros(m, bool), np.zeros(m, bool), 0.99)
    assert compact.obs["rgb"].nbytes == full.obs["rgb"].nbytes * len(rgb_envs) // n
    blocks = [(ro.finish(np.zeros(ro.n, np.float32), 0.99, 0.95)) for ro in (other, full, compact)]
    types = [np.zeros(len(b["adv"]), np.int64) for b in blocks]
    whole = concat_blocks([blocks[0], blocks[1]], types[:2], "cpu")
    mixed = concat_blocks([blocks[0], blocks[2]], [types[0], types[2]], "cpu")
    assert whole["obs_present"] == {} and set(mixed["obs_present"]) == {"rgb"}
    present = mixed["obs_present"]["rgb"]
    expected = np.concatenate([np.ones(2 * T, bool), np.isin(np.arange(T * n) % n, rgb_envs)])
    assert np.array_equal(present.numpy(), expected)  # the whole block's rows, then the rgb envs'
    assert len(mixed["obs"]["rgb"]) == int(present.sum())
    spread = torch.zeros_like(whole["obs"]["rgb"])
    spread[present] = mixed["obs"]["rgb"]
    assert torch.equal(spread, whole["obs"]["rgb"])
    assert torch.equal(whole["obs"]["state"], mixed["obs"]["state"])
    assert torch.equal(whole["adv"], mixed["adv"])


def test_a_rounds_episodes_go_to_their_types_windows_in_row_order():
    learner = _learner("learner.mode=random")
    names, n = learner.plan.names, 8
    types = learner.plan.env_type[:n].astype(np.int64)
    ep_len = np.array([0, 5, 7, 0, 3, 9, 2, 4], dtype=np.int32)
    ep_return = np.arange(n, dtype=np.float32) * 10
    rnd = Round(
        slots=np.array([0]),
        seqs=np.array([3]),
        starts=np.array([0]),
        counts=np.array([n]),
        rows=np.arange(n),
        types=types,
        obs={},
        results={"ep_len": ep_len, "ep_return": ep_return},
        stepped=np.ones(n, dtype=bool),
        final_rows=np.zeros(0, dtype=np.int64),
        final_obs={},
        torn_retries=0,
    )
    learner._episodes(rnd)
    ended = np.flatnonzero(ep_len)
    for t, name in enumerate(names):
        mine = [float(ep_return[i]) for i in ended if types[i] == t]
        assert list(learner.counters.returns[name]) == mine
        assert learner.counters.first_returns[name] == mine
        assert learner.counters.episodes_by_type[name] == len(mine)
    assert learner.counters.episodes == len(ended)
