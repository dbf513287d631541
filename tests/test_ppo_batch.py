"""The PPO batch keeps each obs key compact (rows only for the samples whose type produces it)
through the update, and the update is the one the full, zero-filled batch gives, bit for bit:
day4's policy from the composed config, a batch made by the learner's own rollouts and
concat_blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import compose_cfg, load_benchmark
from rlpipe.config import run_spec
from rlpipe.envs.registry import plan_mix
from rlpipe.learner.policy import Policy
from rlpipe.learner.ppo import concat_blocks, ppo_update
from rlpipe.learner.type_settings import TypeSettings

# day4 at a test's size: its 12 types interleaved, its buffer, CNN, scaling and per-type
# settings; 4 slices of 70 envs, 3 minibatches of unequal size in each of 2 epochs
DAY4_SMALL = (
    "+stage=day4",
    "env_count=350",
    "learner.update_envs=280",
    "learner.rollout_len=4",
    "learner.minibatch_size=400",
    "learner.epochs=2",
)


@pytest.fixture(scope="module")
def day4():
    spec = run_spec(compose_cfg(list(DAY4_SMALL)))
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    lc = spec.learner
    torch.manual_seed(0)
    policy = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    blocks, types = load_benchmark("ppo_update").stage_blocks(spec, plan, policy, 70, seed=3)
    return spec, plan, policy.state_dict(), blocks, types


def _full(batch: dict) -> dict:
    """The batch as the learner made it before: every key a row per sample, zeros where a
    sample's type does not produce it (what the board holds there)."""
    obs = {}
    for key, rows in batch["obs"].items():
        present = batch["obs_present"].get(key)
        if present is None:
            obs[key] = rows
        else:
            obs[key] = rows.new_zeros((len(present),) + rows.shape[1:])
            obs[key][present] = rows
    return {**batch, "obs": obs, "obs_present": {}}


def _train(spec, plan, init, batch, policy=None):
    lc = spec.learner
    policy = policy or Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    policy.load_state_dict(init)
    opt = torch.optim.Adam(policy.parameters(), lr=lc.learning_rate, eps=1e-5, fused=True)
    gen = torch.Generator().manual_seed(spec.run.seed)
    per_type = TypeSettings.of(lc, spec.env_types)
    stats = [ppo_update(policy, opt, batch, lc, gen, per_type=per_type) for _ in range(2)]
    return stats, policy.state_dict(), opt.state_dict()


def test_the_batch_holds_each_key_for_the_samples_whose_type_produces_it(day4):
    spec, plan, _init, blocks, types = day4
    batch = concat_blocks(blocks, types, "cpu")
    n = len(batch["adv"])
    assert set(batch["obs_present"]) == {k.name for k in plan.obs_keys}  # every key: some type lacks it
    for key, present in batch["obs_present"].items():
        produces = torch.tensor([key in s.obs for s in plan.specs])[batch["types"]]
        assert torch.equal(present, produces), key
        assert len(batch["obs"][key]) == int(present.sum()) < n
    rgb = batch["obs"]["rgb"]
    assert rgb.dtype == torch.uint8 and 0 < len(rgb) < n // 2  # day4: about a quarter of the rows
    assert bool((rgb.reshape(len(rgb), -1).amax(1) > 0).all())  # rendered frames, no zero rows


def test_an_update_on_the_compact_batch_is_the_full_batchs_bit_for_bit(day4):
    """Two updates from the same weights, optimizer and generator: the compact batch and the
    zero-filled one give the same stats and the same parameters, PopArt buffers and Adam
    state, to the bit (the arithmetic is the same; only which rows are stored differs)."""
    spec, plan, init, blocks, types = day4
    compact = concat_blocks(blocks, types, "cpu")
    full = _full(compact)
    assert full["obs"]["rgb"].shape[0] == len(full["adv"])
    (c_stats, c_state, c_opt), (f_stats, f_state, f_opt) = (_train(spec, plan, init, b) for b in (compact, full))
    assert c_stats == f_stats
    assert c_stats[0].samples == len(compact["adv"]) and np.isfinite(c_stats[1].total_loss)
    for key in f_state:
        assert torch.equal(c_state[key], f_state[key]), key
    assert not torch.equal(c_state["rgb.conv.0.weight"], init["rgb.conv.0.weight"])  # the CNN trained
    for p, state in f_opt["state"].items():
        for name, value in state.items():
            assert torch.equal(c_opt["state"][p][name], value), (p, name)


def test_a_key_with_rows_for_other_samples_is_refused(day4):
    spec, plan, init, blocks, types = day4
    lc = spec.learner
    policy = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    policy.load_state_dict(init)
    batch = concat_blocks(blocks, types, "cpu")
    obs = {**batch["obs"], "rgb": batch["obs"]["rgb"][1:]}
    with pytest.raises(ValueError, match="obs key 'rgb': .* rows for"):
        policy.evaluate(obs, batch["types"], batch["a_disc"], batch["a_cont"])


def test_prepared_images_encode_as_the_frames_do_bit_for_bit():
    """ImageRows (images converted once, rows picked by index, one padded buffer for every
    call): the features and the gradients of the raw frames' path, call after call."""
    from rlpipe.learner.rgb_encoder import ImageRows, RgbEncoder

    torch.manual_seed(0)
    enc = RgbEncoder((36, 36, 3), (4, 8, 8), 16)
    frames = torch.randint(0, 256, (40, 36, 36, 3), dtype=torch.uint8)
    images = enc.inputs(frames)
    prepared = ImageRows(images, torch.arange(len(frames)))
    for n in (29, 11, 29):
        idx = torch.randperm(len(frames))[:n]
        grads = []
        for x in (frames[idx], prepared[idx]):
            if prepared.padded.buffer is not None:  # what a call leaves there is never read
                prepared.padded.buffer.fill_(float("nan"))
            enc.zero_grad()
            out = enc(x)
            out.square().sum().backward()
            grads.append((out.detach(), [p.grad.clone() for p in enc.parameters()]))
        (a, ga), (b, gb) = grads
        assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(ga, gb))
    assert prepared.padded.buffer is not None and prepared[idx].padded is prepared.padded


def test_the_update_leaves_out_the_boards_columns_no_type_reads():
    """The quick start's CartPoles on the default board (state 32 wide, CartPole's 4 numbers
    first): the update's obs hold the 4 columns, and two updates train as on the whole board
    (the same products; to float32 rounding, where a BLAS takes another kernel for the
    narrower rows)."""
    spec = run_spec(compose_cfg(["env_count=140", "learner.update_envs=140", "learner.minibatch_size=300"]))
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    lc = spec.learner
    assert [(k.name, k.shape) for k in plan.obs_keys] == [("state", (32,))]
    torch.manual_seed(0)
    policy = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    blocks, types = load_benchmark("ppo_update").stage_blocks(spec, plan, policy, 70, seed=3)
    batch = concat_blocks(blocks, types, "cpu")
    assert policy.prepared_obs(batch["obs"])["state"].shape == (len(batch["adv"]), 4)
    assert policy.prepared_obs({"state": torch.zeros(0, 32)})["state"].shape == (0, 4)  # a rank's empty batch
    narrowed = _train(spec, plan, policy.state_dict(), batch)
    whole = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    whole.last_key_unread = 0  # the whole board's 32 columns, as before
    assert whole.prepared_obs(batch["obs"])["state"].shape == (len(batch["adv"]), 32)
    reference = _train(spec, plan, policy.state_dict(), batch, whole)
    for key, value in reference[1].items():
        torch.testing.assert_close(narrowed[1][key], value, rtol=1e-5, atol=1e-6)
    assert not torch.equal(narrowed[1]["critic.inp.weight"], policy.state_dict()["critic.inp.weight"])
