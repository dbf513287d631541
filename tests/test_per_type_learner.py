"""Per-type learner settings: an env node's `learner:` (gamma, gae_lambda, ent_coef,
popart_beta, log_std_init, value_init_std, adv_std_floor) trains that type's rows with its own values, a type without
overrides trains as it did before (bit for bit), and a bad value is a one-paragraph
ConfigError naming the key."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import compose_cfg, ppo_batch, run_cli
from rlpipe.config import ConfigError, ObsKey, run_spec
from rlpipe.envs.registry import plan_mix
from rlpipe.learner.central import CentralLearner
from rlpipe.learner.popart import PopArt
from rlpipe.learner.ppo import ppo_update
from rlpipe.learner.rollout import SliceRollout
from rlpipe.learner.type_settings import TypeSettings

CLASSIC = ("cartpole", "acrobot", "pendulum", "mountaincar_cont")  # env_mix=classic, type order


def _learner(*overrides: str) -> CentralLearner:
    spec = run_spec(compose_cfg(["env_mix=classic", "env_count=8", "buffer=lowdim", *overrides]))
    return CentralLearner(spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing))


def _train(learner: CentralLearner, batch: dict):
    stats = ppo_update(
        learner.policy, learner.optimizer, batch, learner.cfg, learner.generator, per_type=learner.type_settings
    )
    return stats, learner.policy.state_dict()


# -- a type without overrides ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "override",
    [
        "+env_mix.types.cartpole.learner={}",
        "+env_mix.types.cartpole.learner.gamma=0.99",  # the learner's own
        "+env_mix.types.cartpole.learner=null",
    ],
)
def test_an_override_that_changes_nothing_trains_bit_for_bit_as_none(override):
    """Same seed, same batch: a type whose `learner:` is empty (or repeats the learner's
    values) gives the same loss and the same weights as a run without the node key, with an
    entropy bonus and PopArt in play. The GAE settings of a slice of the types no node
    overrides (cartpole, acrobot: pendulum and mountaincar_cont set their horizon on their
    nodes) are the learner's floats."""
    common = ("learner.ent_coef=0.01", "learner.gamma=0.99", "learner.epochs=2", "learner.minibatch_size=64")
    plain, with_empty = _learner(*common), _learner(*common, override)
    assert next(t for t in with_empty.spec.env_types if t.name == "cartpole").node.get("learner") is None
    for learner in (plain, with_empty):
        gamma, lam = learner.type_settings.gae(np.arange(2).repeat(3))
        assert (type(gamma), type(lam)) == (float, float)
        assert (gamma, lam) == (learner.cfg.gamma, learner.cfg.gae_lambda)
    (a_stats, a_state), (b_stats, b_state) = (_train(x, ppo_batch(x, seed=7)) for x in (plain, with_empty))
    assert a_stats == b_stats
    for key in a_state:
        assert torch.equal(a_state[key], b_state[key]), key


def test_a_type_without_overrides_keeps_its_advantages_in_a_slice_with_one_that_has_them():
    """GAE over a slice mixing cartpole (gamma 0.98, lambda 0.8) and acrobot (the learner's):
    acrobot's columns are exactly what a slice of acrobot alone gives (the learner's floats),
    cartpole's follow the textbook recursion with its own values."""
    learner = _learner("+env_mix.types.cartpole.learner.gamma=0.98", "+env_mix.types.cartpole.learner.gae_lambda=0.8")
    types = np.array([0, 1, 0, 1, 1])
    gamma, lam = learner.type_settings.gae(types)
    np.testing.assert_array_equal(gamma, [0.98, 0.99, 0.98, 0.99, 0.99])
    np.testing.assert_array_equal(lam, [0.8, 0.95, 0.8, 0.95, 0.95])
    alone = learner.type_settings.gae(np.array([1, 1]))
    assert alone == (0.99, 0.95)
    T, n = 16, len(types)
    rng = np.random.default_rng(2)
    rewards = rng.normal(0, 10, (T, n)).astype(np.float32)
    values = rng.normal(0, 50, (T, n)).astype(np.float32)
    done = rng.random((T, n)) < 0.1
    next_value = rng.normal(0, 50, n).astype(np.float32)
    key = (ObsKey("state", (2,), "float32"),)
    blocks = []
    for cols, (g, lm) in ((np.arange(n), (gamma, lam)), (np.flatnonzero(types == 1), alone)):
        ro = SliceRollout(len(cols), T, key, 1)
        for t in range(T):
            if t:
                ro.add_outcome(rewards[t - 1, cols], done[t - 1, cols], np.zeros(len(cols), bool), g)
            ro.add_step(
                {"state": np.zeros((len(cols), 2), np.float32)},
                np.zeros(len(cols)),
                np.zeros((len(cols), 1)),
                np.zeros(len(cols)),
                values[t, cols],
            )
        ro.add_outcome(rewards[T - 1, cols], done[T - 1, cols], np.zeros(len(cols), bool), g)
        blocks.append(ro.finish(next_value[cols], g, lm)["adv"].reshape(T, len(cols)))
    mixed, acrobot_alone = blocks
    np.testing.assert_array_equal(mixed[:, types == 1], acrobot_alone)
    for i in np.flatnonzero(types == 0):
        ref, last = np.zeros(T), 0.0
        for t in reversed(range(T)):
            nv = next_value[i] if t == T - 1 else values[t + 1, i]
            keep = 1.0 - done[t, i]
            last = rewards[t, i] + 0.98 * nv * keep - values[t, i] + 0.98 * 0.8 * keep * last
            ref[t] = last
        np.testing.assert_allclose(mixed[:, i], ref, rtol=1e-5, atol=1e-4)


# -- the entropy bonus and PopArt per type ---------------------------------------------------------


def test_each_rows_entropy_bonus_is_its_types_ent_coef():
    """cartpole 0.5, acrobot 0.1, the others the learner's 0: the first minibatch's loss is
    pg - mean(ent_coef[type] * entropy) + vf_coef * v (one epoch, one minibatch: the reported
    loss is the one before the step)."""
    learner = _learner(
        "learner.ent_coef=0.0",
        "learner.epochs=1",
        "learner.minibatch_size=256",
        "+env_mix.types.cartpole.learner.ent_coef=0.5",
        "+env_mix.types.acrobot.learner.ent_coef=0.1",
    )
    batch = ppo_batch(learner)
    before = copy.deepcopy(learner.policy)
    stats, _ = _train(learner, batch)
    with torch.no_grad():
        _logp, entropy, _v = before.evaluate(batch["obs"], batch["types"], batch["a_disc"], batch["a_cont"])
    coef = torch.tensor([0.5, 0.1, 0.0, 0.0])[batch["types"]]
    bonus = stats.policy_loss + learner.cfg.vf_coef * stats.value_loss - stats.total_loss
    assert bonus == pytest.approx(float((coef * entropy).mean()), rel=1e-5)
    assert stats.entropy == pytest.approx(float(entropy.mean()), rel=1e-5)  # the plain mean, as before


def test_popart_moves_each_types_statistics_with_its_own_step_size():
    """beta 1 for type 0 (its statistics become the batch's at once); the other types move
    exactly as with the learner's one beta."""
    g = torch.Generator().manual_seed(3)
    returns = torch.randn(300, generator=g, dtype=torch.float64) * 20 + 5
    types = torch.arange(3).repeat(100)
    layers = [SimpleNamespace(weight=torch.ones(3, 1, 4), bias=torch.zeros(3, 1)) for _ in range(2)]
    mixed, single = PopArt(3), PopArt(3)
    for _ in range(2):  # a second batch: type 0 keeps no memory of the first at beta 1
        mixed.update(returns, types, torch.tensor([1.0, 3e-4, 3e-4], dtype=torch.float64), layers[0])
        single.update(returns, types, 3e-4, layers[1])
    r0 = returns[types == 0]
    assert mixed.mu[0].item() == pytest.approx(r0.mean().item(), rel=1e-9)
    assert mixed.sigma[0].item() == pytest.approx(r0.std(unbiased=False).item(), rel=1e-9)
    assert torch.equal(mixed.mu[1:], single.mu[1:]) and torch.equal(mixed.sigma[1:], single.sigma[1:])


def test_value_init_std_scales_its_types_value_row_and_nothing_else():
    """pendulum's value output row starts at 0.01 of the default build's; every other
    parameter of the two builds (same seed) is the same tensor, bit for bit."""
    plain, scaled = _learner(), _learner("+env_mix.types.pendulum.learner.value_init_std=0.01")
    np.testing.assert_array_equal(scaled.type_settings.value_init_std, [1.0, 1.0, 0.01, 1.0])
    a, b = plain.policy.state_dict(), scaled.policy.state_dict()
    for key in a:
        if key != "critic.out.weight":
            assert torch.equal(a[key], b[key]), key
    w_plain, w_scaled = a["critic.out.weight"], b["critic.out.weight"]
    assert torch.equal(w_scaled[[0, 1, 3]], w_plain[[0, 1, 3]])
    torch.testing.assert_close(w_scaled[2], w_plain[2] * 0.01, rtol=0, atol=0)
    assert torch.equal(scaled.actor.critic.out.weight, w_scaled)  # the serving copy starts the same


def test_adv_std_floor_divides_a_quiet_types_advantages_by_no_less_than_it():
    """Type 0's advantages spread 0.01 (a sparse-reward type before its first reward: the
    critic's guesses differenced) and type 1's spread 10: with a floor of 0.5 on type 0 its
    normalized advantages are 0.02-sized instead of unit-sized, type 1's are as without
    floors, and the all-reduce form (normalize_per_type_sums) agrees. No floor set: the
    learner passes none, and the normalization is the one before floors."""
    from rlpipe.learner.ppo import normalize_per_type, normalize_per_type_sums

    g = torch.Generator().manual_seed(5)
    types = torch.arange(2).repeat(200)
    adv = torch.randn(400, generator=g, dtype=torch.float64) * torch.where(types == 0, 0.01, 10.0)
    floor = torch.tensor([0.5, 0.0], dtype=torch.float64)
    plain, floored = normalize_per_type(adv, types, 2), normalize_per_type(adv, types, 2, floor)
    assert plain[types == 0].std().item() == pytest.approx(1.0, rel=1e-5)  # std + 1e-8
    assert floored[types == 0].std().item() == pytest.approx(adv[types == 0].std().item() / 0.5, rel=1e-6)
    assert torch.equal(floored[types == 1], plain[types == 1])
    sums = [torch.zeros(2, dtype=torch.float64).index_add_(0, types, x) for x in (torch.ones_like(adv), adv, adv * adv)]
    torch.testing.assert_close(normalize_per_type_sums(adv, types, *sums, floor), floored)
    assert _learner().type_settings.adv_std_floor_by_type() is None
    with_floor = _learner("+env_mix.types.acrobot.learner.adv_std_floor=0.1").type_settings
    assert torch.equal(with_floor.adv_std_floor_by_type(), torch.tensor([0.0, 0.1, 0.0, 0.0], dtype=torch.float64))


def test_type_settings_follow_the_mix_order_and_default_to_the_learner():
    learner = _learner(
        "learner.gamma=0.97",
        "++env_mix.types.pendulum.learner.gamma=0.9",  # ++: pendulum's node has a learner.gamma
        "+env_mix.types.acrobot.learner.popart_beta=0.01",
    )
    s = learner.type_settings
    assert learner.plan.names == CLASSIC
    # mountaincar_cont's 0.9999 is its node's (conf/env/mountaincar_cont.yaml), over learner.gamma
    np.testing.assert_array_equal(s.gamma, [0.97, 0.97, 0.9, 0.9999])
    np.testing.assert_array_equal(s.popart_beta, [3e-4, 0.01, 3e-4, 3e-4])
    assert s.ent_coef_rows(torch.tensor([0, 2])) == learner.cfg.ent_coef  # one value: a float
    assert torch.is_tensor(s.popart_beta_by_type())
    np.testing.assert_array_equal(TypeSettings.of(learner.cfg, learner.spec.env_types).gamma, s.gamma)


def test_shared_type_settings_give_every_type_the_learners_values():
    """The ablation switch: `learner.type_settings=shared` ignores the env nodes' `learner:`
    (mountaincar_cont's node sets gamma 0.9999 and log std 1, pendulum's gamma 0.9), so every
    type trains with the learner's values, each handed on as one float as before the
    per-type settings."""
    learner = _learner("learner.type_settings=shared", "learner.gamma=0.97")
    s = learner.type_settings
    np.testing.assert_array_equal(s.gamma, [0.97] * 4)
    np.testing.assert_array_equal(s.log_std_init, [0.0] * 4)
    assert s.gae(np.array([0, 2, 3])) == (0.97, learner.cfg.gae_lambda)
    assert torch.equal(learner.policy.log_std.detach(), torch.zeros_like(learner.policy.log_std))
    with pytest.raises(ConfigError, match=r"learner\.type_settings.*per_type.*shared"):
        run_spec(compose_cfg(["learner.type_settings=off"]))


def test_each_continuous_types_log_std_starts_at_its_log_std_init():
    """pendulum -1, mountaincar_cont 0.5 (both dims of the head's row), the others the
    learner's; the Gaussian's scale at the first act is exp of it, and the serving copy
    starts with the same. A type whose node sets none starts at CleanRL's zeros (here
    mountaincar_cont's node sets 1.0 for its exploration: conf/env/mountaincar_cont.yaml)."""
    plain = _learner()
    np.testing.assert_array_equal(plain.policy.log_std.detach()[:, 0].numpy(), [0.0, 0.0, 0.0, 1.0])
    learner = _learner(
        "learner.log_std_init=-0.25",
        "+env_mix.types.pendulum.learner.log_std_init=-1",
        "++env_mix.types.mountaincar_cont.learner.log_std_init=0.5",
    )
    np.testing.assert_array_equal(learner.type_settings.log_std_init, [-0.25, -0.25, -1.0, 0.5])
    log_std = learner.policy.log_std.detach()
    assert log_std.shape[0] == 4
    for t, want in enumerate([-0.25, -0.25, -1.0, 0.5]):
        assert torch.equal(log_std[t], torch.full_like(log_std[t], want))
    assert torch.equal(learner.actor.log_std, learner.policy.log_std)
    obs = {k.name: torch.zeros((4,) + k.shape) for k in learner.plan.obs_keys}
    _disc, cont = learner.policy._dists(*learner.policy._sorted(obs, torch.arange(4)))
    torch.testing.assert_close(cont.scale[:, 0], torch.tensor([-0.25, -0.25, -1.0, 0.5]).exp())


# -- checks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,key,allowed",
    [
        ("+env_mix.types.cartpole.learner.gamma=1.5", "env_mix.types.cartpole.learner.gamma", "[0, 1]"),
        ("+env_mix.types.cartpole.learner.gamma=true", "env_mix.types.cartpole.learner.gamma", "[0, 1]"),
        ("+env_mix.types.acrobot.learner.gae_lambda=-0.1", "env_mix.types.acrobot.learner.gae_lambda", "[0, 1]"),
        ("+env_mix.types.acrobot.learner.ent_coef=-1", "env_mix.types.acrobot.learner.ent_coef", ">= 0"),
        ("+env_mix.types.acrobot.learner.ent_coef=lots", "env_mix.types.acrobot.learner.ent_coef", ">= 0"),
        ("+env_mix.types.pendulum.learner.popart_beta=0", "env_mix.types.pendulum.learner.popart_beta", "(0, 1]"),
        ("+env_mix.types.pendulum.learner.log_std_init=3", "env_mix.types.pendulum.learner.log_std_init", "[-5, 2]"),
        ("+env_mix.types.pendulum.learner.log_std_init=wide", "env_mix.types.pendulum.learner.log_std_init", "[-5, 2]"),
        ("learner.log_std_init=-6", "learner.log_std_init", "[-5, 2]"),
        ("+env_mix.types.acrobot.learner.value_init_std=0", "env_mix.types.acrobot.learner.value_init_std", "positive"),
        ("+env_mix.types.acrobot.learner.adv_std_floor=-1", "env_mix.types.acrobot.learner.adv_std_floor", ">= 0"),
        ("+env_mix.types.pendulum.learner.clip_coef=0.1", "env_mix.types.pendulum.learner.clip_coef", "log_std_init"),
        ("++env_mix.types.pendulum.learner=0.99", "env_mix.types.pendulum.learner", "mapping"),
    ],
)
def test_a_bad_per_type_value_is_a_config_error_naming_the_key(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        run_spec(compose_cfg(["env_mix=classic", override]))
    message = str(err.value)
    assert f"Invalid config value {key}=" in message and "allowed" in message and allowed in message
    assert "\n" not in message


def test_cli_bad_per_type_value_is_one_paragraph_no_traceback(short_tmp):
    out = run_cli(short_tmp / "run", "+env_mix.types.cartpole.learner.gamma=2", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "env_mix.types.cartpole.learner.gamma=2" in out.stderr and "[0, 1]" in out.stderr
