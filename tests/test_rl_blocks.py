"""Building blocks of issue #7: reward normalization, stability score, gradient weights,
epsilon-greedy behaviour log-prob, checkpoints. Fast: pure numpy/torch on CPU."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from rlpipe.config import ObsKey
from rlpipe.envs.contract import EnvSpec
from rlpipe.envs.registry import ActionSpace, MixPlan
from rlpipe.learner.checkpoint import (
    CheckpointError,
    checkpoint_files,
    load_latest,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rlpipe.learner.policy import Policy, feature_widths
from rlpipe.learner.scaling import score_to_epsilon, score_to_weight, weighted_ppo_terms
from rlpipe.worker.exploration import EpsilonGreedy, pack_epsilons, unpack_epsilons
from rlpipe.worker.rewardnorm import RewardNormalizer
from rlpipe.worker.stability import StabilityTracker

# The reward-norm settings a run passes: reward_norm.clip (conf/reward_norm/per_env.yaml) and
# learner.gamma (conf/learner/ppo.yaml).
CLIP, GAMMA = 10.0, 0.99

# (loc, scale) of the reward streams: unit, huge, huge offset with a small spread, tiny.
SCALES = [(0.0, 1.0), (3e8, 1e8), (1e8, 1.0), (3e-8, 1e-8), (-1e-8, 1e-8)]


def _var_rtol(loc, scale):
    """A streaming update can keep the variance to ~eps * |loc| / scale relative (the rounding
    of each new value against the running mean); 1e-10 when the stream is well conditioned."""
    return 1e-10 + 8 * np.finfo(np.float64).eps * abs(loc) / scale


def _stream(rng, loc, scale, shape):
    # heavy-ish tails and a mean offset: harder than a plain normal
    return loc + scale * rng.standard_t(5, size=shape)


# -- reference code: the formulas the C kernels of rlpipe/native/slicestats.pyx compute, in numpy
# and torch, written plainly so the kernels can be checked against them ---------------------------


def stability_score(reward_spread: np.ndarray, len_cv: np.ndarray, cut_frac: np.ndarray) -> np.ndarray:
    """score = (1 - c) / (1 + s_r + cv_L), inputs clipped to their domains; float32 in [0, 1]
    (rlpipe/worker/stability.py's formula)."""
    s_r = np.maximum(np.nan_to_num(reward_spread, nan=0.0, posinf=1e30), 0.0)
    cv = np.maximum(np.nan_to_num(len_cv, nan=0.0, posinf=1e30), 0.0)
    c = np.clip(np.nan_to_num(cut_frac, nan=0.0), 0.0, 1.0)
    return np.clip((1.0 - c) / (1.0 + s_r + cv), 0.0, 1.0).astype(np.float32)


def uniform_logp_np(is_cont: np.ndarray, n_valid: np.ndarray, a_cont: np.ndarray | None = None) -> np.ndarray:
    """log u(a) of the exploration uniform: -log(n_valid) for discrete envs; for continuous
    envs -d log 2 when the valid dims of a_cont [m, D] lie in [-1, 1], else -inf."""
    is_cont = np.asarray(is_cont, dtype=bool)
    n_valid = np.asarray(n_valid, dtype=np.float64)
    out = -np.log(np.maximum(n_valid, 1.0))
    if is_cont.any():
        a = np.asarray(a_cont).reshape(len(is_cont), -1)
        dims = np.arange(a.shape[1]) < n_valid[:, None]
        inside = ((np.abs(a) <= 1.0) | ~dims).all(axis=1)
        out = np.where(is_cont, np.where(inside, -n_valid * math.log(2.0), -np.inf), out)
    return out


def mixture_logp_np(policy_logp: np.ndarray, epsilon: np.ndarray | float, log_u: np.ndarray) -> np.ndarray:
    """log((1 - eps) exp(policy_logp) + eps exp(log_u)) in float64; exactly policy_logp
    where eps == 0."""
    lp = np.asarray(policy_logp, dtype=np.float64)
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), lp.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        mixed = np.logaddexp(np.log1p(-eps) + lp, np.log(eps) + np.asarray(log_u, dtype=np.float64))
    return np.where(eps > 0, mixed, lp)


def uniform_logp_torch(is_cont: torch.Tensor, n_valid: torch.Tensor, a_cont: torch.Tensor) -> torch.Tensor:
    """`uniform_logp_np` in torch."""
    n = n_valid.to(torch.float32)
    out = -torch.log(n.clamp_min(1.0))
    if bool(is_cont.any()):
        dims = torch.arange(a_cont.shape[1], device=a_cont.device) < n_valid[:, None]
        inside = ((a_cont.abs() <= 1.0) | ~dims).all(dim=1)
        cont = torch.where(inside, -n * math.log(2.0), torch.full_like(n, -math.inf))
        out = torch.where(is_cont, cont, out)
    return out


def mixture_logp_torch(policy_logp: torch.Tensor, epsilon, log_u) -> torch.Tensor:
    """`mixture_logp_np` in torch (the dtype of policy_logp)."""
    eps = torch.as_tensor(epsilon, dtype=policy_logp.dtype, device=policy_logp.device).expand_as(policy_logp)
    log_u = torch.as_tensor(log_u, dtype=policy_logp.dtype, device=policy_logp.device).expand_as(policy_logp)
    mixed = torch.logaddexp(torch.log1p(-eps) + policy_logp, torch.log(eps) + log_u)
    return torch.where(eps > 0, mixed, policy_logp)


# -- reward normalization --------------------------------------------------------------------------


@pytest.mark.parametrize("loc,scale", SCALES)
def test_welford_per_env_matches_float64_reference(loc, scale):
    rng = np.random.default_rng(1)
    n, steps = 12, 400
    x = _stream(rng, loc, scale, (steps, n)) * rng.uniform(0.5, 2.0, n)  # per-env scale
    norm = RewardNormalizer(n, "mean_std", None, GAMMA)
    half = n // 2
    for t in range(steps):  # two slices, one step at a time
        norm.normalize(0, half, x[t, :half])
        out = norm.normalize(half, n, x[t, half:])
    ref_mean, ref_var = x.mean(axis=0), x.var(axis=0)
    assert (norm.count == steps).all()
    np.testing.assert_allclose(norm.mean, ref_mean, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(norm.std**2, ref_var, rtol=_var_rtol(loc, scale))
    if abs(loc) / scale >= 1e7:  # the reference is discriminating: naive sums fail here
        naive = (x**2).mean(axis=0) - x.mean(axis=0) ** 2
        assert np.abs(naive / ref_var - 1).max() > 1e-3
    expected = (x[-1, half:] - ref_mean[half:]) / (np.sqrt(ref_var[half:]) + 1e-8)
    np.testing.assert_allclose(out, expected.astype(np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loc,scale", SCALES)
def test_welford_blocks_and_global_match_reference(loc, scale):
    rng = np.random.default_rng(2)
    n = 7
    blocks = [_stream(rng, loc, scale, (T, n)) for T in (1, 5, 33, 2, 60)]
    x = np.concatenate(blocks)
    per_env = RewardNormalizer(n, "mean_std", CLIP, GAMMA)
    glob = RewardNormalizer(n, "global", CLIP, GAMMA)
    for b in blocks:  # [T, m] blocks (Chan combine)
        per_env.normalize(0, n, b)
        for row in b:  # global statistics: two slices a step
            glob.update(0, 3, row[:3])
            glob.update(3, n, row[3:])
    np.testing.assert_allclose(per_env.mean, x.mean(axis=0), rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(per_env.std**2, x.var(axis=0), rtol=_var_rtol(loc, scale))
    assert glob.count[0] == x.size
    np.testing.assert_allclose(glob.mean[0], x.mean(), rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(glob.std[0] ** 2, x.var(), rtol=_var_rtol(loc, scale))


def _per_env_numpy(count, mean, m2, ret, lo, hi, r, done, clip):
    """reward_norm=per_env's one step as RewardNormalizer.normalize computed it in numpy before
    its C kernel (the reference the kernel must match bit for bit)."""
    x = np.asarray(r).astype(np.float64)
    g = ret[lo:hi]
    g *= GAMMA
    g += x
    c, mu, s2 = count[lo:hi], mean[lo:hi], m2[lo:hi]
    c += 1
    delta = g - mu
    mu += delta / c
    s2 += delta * (g - mu)
    scale = np.where(c > 1, np.sqrt(s2 / np.maximum(c, 1) + 1e-8), 1.0)
    x /= scale
    if done is not None:
        g[np.asarray(done, dtype=bool)] = 0.0
    if clip is not None:
        np.clip(x, -clip, clip, out=x)
    return x.astype(np.float32)


@pytest.mark.parametrize("clip", [CLIP, None])
@pytest.mark.parametrize("loc,scale", SCALES)
def test_per_env_kernel_matches_the_numpy_form_bit_for_bit(loc, scale, clip):
    """The C kernel of reward_norm=per_env (rlpipe/native/slicestats.pyx) against the numpy
    form it replaced: the normalized rewards and every statistic, the same bits, over two
    slices of one worker, float32 and float64 rewards, episode ends now and then (some steps
    pass none), rewards that clip."""
    rng = np.random.default_rng(3)
    n, steps, half = 9, 300, 4
    norm = RewardNormalizer(n, "per_env", clip, GAMMA)
    count, mean, m2, ret = np.zeros(n, np.int64), np.zeros(n), np.zeros(n), np.zeros(n)
    for t in range(steps):
        x = _stream(rng, loc, scale, n)
        if t % 50 == 7:
            x[2] = 1e12  # past any clip
        x = x.astype(np.float32) if t % 2 else x
        done = rng.random(n) < 0.05 if t % 3 else None
        for lo, hi in ((0, half), (half, n)):
            d = None if done is None else done[lo:hi]
            want = _per_env_numpy(count, mean, m2, ret, lo, hi, x[lo:hi], d, clip)
            got = norm.normalize(lo, hi, x[lo:hi], d)
            assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    for ours, ref in ((norm.count, count), (norm.mean, mean), (norm.m2, m2), (norm.ret, ret)):
        assert ours.tobytes() == ref.tobytes()
    assert norm.count.min() == steps
    # the kernel indexes without bounds checks: a range or `done` that does not fit is refused
    with pytest.raises(ValueError, match=r"envs \[5, 10\) of a normalizer over 9 envs"):
        norm.normalize(5, 10, np.ones(5))
    with pytest.raises(ValueError, match="done of length 2"):
        norm.normalize(0, 3, np.ones(3), np.zeros(2, dtype=bool))


def test_float32_input_and_clip_and_off():
    norm = RewardNormalizer(3, "mean_std", CLIP, GAMMA)
    r = np.zeros(3, dtype=np.float32)
    for _ in range(500):
        out = norm.normalize(0, 3, r + np.float32(1.0))
    assert out.dtype == np.float32 and np.all(out == 0.0)  # constant reward -> 0
    out = norm.normalize(0, 3, np.array([1e6, -1e6, 1.0], dtype=np.float32))
    assert out[0] == 10.0 and out[1] == -10.0  # documented clip (raw: ~22 sigma)
    off = RewardNormalizer(3, "off", CLIP, GAMMA)
    raw = np.array([5.0, -3.0, 1e9], dtype=np.float32)
    np.testing.assert_array_equal(off.normalize(0, 3, raw), raw)
    assert RewardNormalizer.from_state(off.state(), CLIP, GAMMA).mode == "off"
    with pytest.raises(ValueError, match="mode"):
        RewardNormalizer(3, "per-env", CLIP, GAMMA)


def test_state_round_trip_merge_and_errors():
    rng = np.random.default_rng(3)
    workers = [
        RewardNormalizer(5, "mean_std", CLIP, GAMMA),
        RewardNormalizer(4, "mean_std", CLIP, GAMMA),
        RewardNormalizer(6, "global", CLIP, GAMMA),
    ]
    seen = []
    for w in workers:
        x = rng.normal(rng.uniform(-50, 50), rng.uniform(0.1, 30), (80, w.n))
        for row in x:
            w.update(0, w.n, row)
        seen.append(x.ravel())
    states = [w.state() for w in workers]
    assert len(states[0]) == 16 + 24 * 5 and len(states[2]) == 16 + 24
    count, mean, var = RewardNormalizer.merge(states + [RewardNormalizer(2, "off", CLIP, GAMMA).state()])
    allx = np.concatenate(seen)
    assert count == allx.size
    assert mean == pytest.approx(allx.mean(), rel=1e-12)
    assert var == pytest.approx(allx.var(), rel=1e-10)
    # a restarted worker restores its statistics exactly
    fresh = RewardNormalizer(5, "mean_std", CLIP, GAMMA)
    fresh.load(states[0])
    np.testing.assert_array_equal(fresh.mean, workers[0].mean)
    np.testing.assert_array_equal(fresh.m2, workers[0].m2)
    np.testing.assert_array_equal(fresh.count, workers[0].count)
    assert fresh.stats() == workers[0].stats()
    assert RewardNormalizer.from_state(states[1], CLIP, GAMMA).stats()["count"] == 80 * 4
    bad = {
        "magic": b"XXXX" + states[0][4:],
        "truncated": states[0][:-3],
        "short": states[0][:5],
        "version": states[0][:4] + b"\x09" + states[0][5:],
    }
    for _what, data in bad.items():
        with pytest.raises(ValueError):
            fresh.load(data)
    with pytest.raises(ValueError, match="mode 'global'"):
        fresh.load(states[2])
    with pytest.raises(ValueError, match="holds 4 envs"):
        fresh.load(states[1])
    np.testing.assert_array_equal(fresh.mean, workers[0].mean)  # unchanged after failures


# -- stability score and weights -------------------------------------------------------------------


def test_stability_score_formula_bounds():
    assert stability_score(np.array([0.0]), np.array([0.0]), np.array([0.0]))[0] == 1.0
    assert stability_score(np.array([0.0]), np.array([0.0]), np.array([1.0]))[0] == 0.0
    assert stability_score(np.array([np.inf]), np.array([0.0]), np.array([0.0]))[0] < 1e-20
    assert stability_score(np.array([np.nan]), np.array([np.nan]), np.array([np.nan]))[0] == 1.0
    rng = np.random.default_rng(4)
    s = stability_score(rng.exponential(5, 1000), rng.exponential(1, 1000), rng.uniform(0, 1, 1000))
    assert s.dtype == np.float32 and (s >= 0).all() and (s <= 1).all()
    base = stability_score(np.full(50, 0.5), np.full(50, 0.5), np.full(50, 0.2))
    assert (stability_score(np.full(50, 0.9), np.full(50, 0.5), np.full(50, 0.2)) < base).all()
    assert (stability_score(np.full(50, 0.5), np.full(50, 0.9), np.full(50, 0.2)) < base).all()
    assert (stability_score(np.full(50, 0.5), np.full(50, 0.5), np.full(50, 0.6)) < base).all()


def test_stability_tracker_envs():
    rng = np.random.default_rng(5)
    n, window = 4, 100
    tr = StabilityTracker(n, window=window)
    assert (tr.scores(0, n) == 1.0).all()  # no data: neutral
    last_end = -1
    for t in range(300):
        rewards = np.array(
            [
                1.0,  # steady
                rng.normal(0, 100),  # wild rewards, +-100
                1.0,  # crashes now and then
                1.0,
            ]
        )  # erratic episode lengths
        ep_len = np.zeros(n, dtype=np.int64)
        cut = np.zeros(n, dtype=bool)
        if t % 20 == 19:
            ep_len[[0, 1]] = 20
        if t % 7 == 6:
            cut[2] = True
        if t in (3, 5, 60, 62, 200, 201, 299):
            ep_len[3], last_end = t - last_end, t
        tr.update(0, 2, rewards[:2], ep_len[:2], cut[:2])  # two slices
        tr.update(2, n, rewards[2:], ep_len[2:], None if t % 2 else cut[2:])
    s = tr.scores(0, n)
    assert s.dtype == np.float32 and ((s >= 0) & (s <= 1)).all()
    assert s[0] == pytest.approx(1.0)
    assert s[1] < 0.05
    assert s[2] < 0.6  # every other cut is reported (cut=None on odd steps)
    assert s[3] < 0.7
    spread, len_cv, cut_frac, enough = tr.terms(0, n)
    assert enough.all() and cut_frac[2] > 0 and len_cv[3] > 0
    np.testing.assert_allclose(s, stability_score(spread, len_cv, cut_frac), rtol=1e-6)
    # an env that crashes at every step: score 0
    tr2 = StabilityTracker(2, window=20)
    for _ in range(30):
        tr2.update(0, 2, np.zeros(2), np.zeros(2, dtype=np.int64), np.array([True, False]))
    assert tr2.scores(0, 2)[0] == 0.0 and tr2.scores(0, 2)[1] == 1.0
    # too little data is neutral, whatever the rewards
    tr3 = StabilityTracker(1, window=100, neutral=0.5)
    for _ in range(tr3.min_steps - 1):
        tr3.update(0, 1, rng.normal(0, 1e6, 1), np.zeros(1, dtype=np.int64))
    assert tr3.scores(0, 1)[0] == 0.5
    tr3.update(0, 1, rng.normal(0, 1e6, 1), np.zeros(1, dtype=np.int64))
    assert tr3.scores(0, 1)[0] < 0.01


def _two_pass_terms(
    reward_hist: list[list[float]], ends: list[list[tuple[float, bool]]], window: int, episodes: int, scale: float
) -> np.ndarray:
    """The module doc's terms from each env's full history, in plain numpy: population std of
    its last `window` rewards over the reference scale, cv of its last `episodes` episode
    lengths (0 below two), share of those that were cut."""
    out = []
    for rs, es in zip(reward_hist, ends):
        r = np.array(rs[-window:], dtype=np.float64)
        last = es[-episodes:]
        lengths = np.array([length for length, _ in last], dtype=np.float64)
        cv = lengths.std() / max(lengths.mean(), 1.0) if len(last) >= 2 else 0.0
        cut = sum(c for _, c in last) / len(last) if last else 0.0
        out.append((r.std() / scale if len(r) else 0.0, cv, cut))
    return np.array(out)


def test_stability_tracker_matches_a_two_pass_reference():
    """The C ring buffers and scores against the formula computed from each env's whole
    history: partly filled windows, wrapped windows, normal ends, cuts, two slices."""
    rng = np.random.default_rng(11)
    n, window, episodes, scale = 6, 16, 4, 2.5
    tr = StabilityTracker(n, window=window, episodes=episodes, reward_scale=scale)
    hist: list[list[float]] = [[] for _ in range(n)]
    ends: list[list[tuple[float, bool]]] = [[] for _ in range(n)]
    since = np.zeros(n, dtype=np.int64)
    for t in range(70):
        rewards = (rng.normal(0, 1 + np.arange(n)) * 10).astype(np.float32)  # float32, as the board
        ep_len = np.where(rng.random(n) < 0.15, rng.integers(1, 40, n), 0).astype(np.int32)
        cut = (rng.random(n) < 0.08) & (ep_len == 0)
        for i in range(n):
            hist[i].append(float(rewards[i]))
            since[i] += 1
            if ep_len[i] > 0 or cut[i]:
                ends[i].append((float(ep_len[i]) if ep_len[i] > 0 else float(since[i]), bool(cut[i])))
                since[i] = 0
        tr.update(0, 3, rewards[:3], ep_len[:3], cut[:3])
        tr.update(3, n, rewards[3:], ep_len[3:], cut[3:])
        if t in (1, 5, 15, 16, 40, 69):
            spread, len_cv, cut_frac, enough = tr.terms(0, n)
            ref = _two_pass_terms(hist, ends, window, episodes, scale)
            np.testing.assert_allclose(np.stack([spread, len_cv, cut_frac], 1), ref, rtol=1e-12, atol=1e-12)
            expect = np.where(enough, stability_score(*ref.T), 1.0).astype(np.float32)
            out = np.full(n, -1.0, dtype=np.float32)
            assert tr.scores(0, n, out=out) is out
            np.testing.assert_allclose(out, expect, rtol=1e-6)
            np.testing.assert_array_equal(tr.scores(2, 5), out[2:5])
            assert enough.tolist() == [t + 1 >= tr.min_steps] * n
    # the C kernels index without bounds checks: a range or an array that does not fit is refused
    with pytest.raises(ValueError, match=r"envs \[4, 7\) of a tracker over 6 envs"):
        tr.update(4, 7, np.ones(3), np.zeros(3, dtype=np.int32))
    with pytest.raises(ValueError, match=r"arrays of lengths \[2, 3\]"):
        tr.update(0, 3, np.ones(2), np.zeros(3, dtype=np.int32))
    with pytest.raises(ValueError):
        tr.scores(0, 3, out=np.empty(2, dtype=np.float32))
    eg = EpsilonGreedy(np.zeros(4, dtype=bool), np.full(4, 2), seed=0)
    eg.set_epsilon(0.5)
    a, c, lp = np.zeros(3, np.int32), np.zeros((3, 1), np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"envs \[2, 5\) of 4"):
        eg.apply(2, 5, a, c, lp, a, c, lp)
    with pytest.raises(ValueError, match="alternatives of 2"):
        eg.apply(0, 3, a, c, lp, a, np.zeros((3, 2), np.float32), lp)


def test_apply_slice_on_the_boards_arrays_matches_apply():
    """apply_slice on board-shaped arrays (the kernel in place) against `apply` and the copy of
    its answer into the results, from the same seed: the same executed actions, behaviour
    log-probs, counts and draws, over discrete and continuous envs (some actions outside
    [-1, 1]), slices whose rates are all 0 (no draw), and arrays that are not the board's (the
    copying path)."""
    rng = np.random.default_rng(7)
    n, D = 40, 3
    is_cont = np.arange(n) % 3 == 0
    n_valid = np.where(is_cont, 1 + np.arange(n) % 3, 2 + np.arange(n) % 4)
    eps = rng.uniform(0.0, 0.8, n)
    eps[10:20] = 0.0  # a slice on policy
    fast, slow = (EpsilonGreedy(is_cont, n_valid, seed=4) for _ in range(2))
    for eg in (fast, slow):
        eg.set_epsilon(eps)

    def board():
        acts = {
            "discrete": rng.integers(0, 2, n).astype(np.int32),
            "continuous": rng.normal(0, 1.2, (n, D)).astype(np.float32),
            "logp": rng.normal(-1, 0.3, n).astype(np.float32),
            "alt_discrete": rng.integers(0, 2, n).astype(np.int32),
            "alt_continuous": rng.uniform(-1, 1, (n, D)).astype(np.float32),
            "alt_logp": rng.normal(-1, 0.3, n).astype(np.float32),
        }
        results = {
            "exec_discrete": np.full(n, -1, np.int32),
            "exec_continuous": np.full((n, D), np.nan, np.float32),
            "behaviour_logp": np.full(n, np.nan, np.float32),
        }
        return acts, results

    total = 0
    for _ in range(5):
        acts, got = board()
        want = {k: v.copy() for k, v in got.items()}
        for lo, hi in ((0, 10), (10, 20), (20, 33), (33, 40)):
            count = fast.apply_slice(lo, hi, acts, got)
            f = [
                acts[k][lo:hi] for k in ("discrete", "continuous", "logp", "alt_discrete", "alt_continuous", "alt_logp")
            ]
            ed, ec, blogp, explored = slow.apply(lo, hi, *f)
            want["exec_discrete"][lo:hi], want["exec_continuous"][lo:hi] = ed, ec
            want["behaviour_logp"][lo:hi] = blogp
            assert count == int(explored.sum())
            assert count == 0 or lo != 10  # the on-policy slice explores nothing
            total += count
        for k in want:
            assert got[k].tobytes() == want[k].tobytes(), k
    assert total > 0
    # not the board's arrays (int64 actions): the copying path, the same answer
    acts, got = board()
    want = {k: v.copy() for k, v in got.items()}
    wide = {**acts, "discrete": acts["discrete"].astype(np.int64)}
    assert fast.apply_slice(20, 33, wide, got) == slow.apply_slice(20, 33, acts, want)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    with pytest.raises(ValueError, match=r"envs \[35, 45\) of 40"):  # past the end: refused
        fast.apply_slice(35, 45, acts, got)


def test_score_to_weight_and_epsilon_bounds():
    s = np.array([-1.0, 0.0, 0.25, 0.5, 1.0, 2.0], dtype=np.float32)
    w = score_to_weight(s, 0.3)
    np.testing.assert_allclose(w, [0.3, 0.3, 0.475, 0.65, 1.0, 1.0], rtol=1e-6)
    assert (np.diff(score_to_weight(np.linspace(0, 1, 101), 0.3)) >= 0).all()
    tw = score_to_weight(torch.tensor([0.0, 1.0]), 0.3)
    assert isinstance(tw, torch.Tensor) and torch.allclose(tw, torch.tensor([0.3, 1.0]))
    np.testing.assert_array_equal(score_to_weight(s, 1.0), np.ones_like(s))  # min_weight 1: off
    e = score_to_epsilon(s, eps_max=0.2, eps_min=0.01)
    np.testing.assert_allclose(e[[1, 4]], [0.2, 0.01], rtol=1e-6)
    assert (np.diff(score_to_epsilon(np.linspace(0, 1, 101), 0.2, 0.0)) <= 0).all()
    with pytest.raises(ValueError):
        score_to_weight(s, 1.5)


# -- epsilon-greedy behaviour log-prob -------------------------------------------------------------


def _plan():
    specs = (
        EnvSpec({"state": ((6,), "float32")}, "discrete", 3),
        EnvSpec({"state": ((6,), "float32")}, "discrete", 5),
        EnvSpec({"state": ((6,), "float32")}, "continuous", 2),
        EnvSpec({"state": ((6,), "float32")}, "continuous", 3),
    )
    env_type = np.tile(np.arange(4, dtype=np.int16), 64)
    return MixPlan(("d3", "d5", "c2", "c3"), specs, env_type, ActionSpace(5, 3), (ObsKey("state", (6,), "float32"),))


def test_behaviour_logp_under_epsilon_mixing_matches_direct_computation():
    torch.manual_seed(0)
    plan = _plan()
    policy = Policy(plan, (ObsKey("state", (6,), "float32"),), (16,)).double()
    with torch.no_grad():
        policy.log_std.fill_(0.4)  # wide Gaussians: some samples leave [-1, 1]
    b = len(plan.env_type)
    types = torch.from_numpy(plan.env_type.astype(np.int64))
    obs = {"state": torch.randn(b, 6, dtype=torch.float64) * 3}
    torch.manual_seed(5)
    ref = policy.act(obs, types)
    torch.manual_seed(5)
    out = policy.act_explore(obs, types, torch.Generator().manual_seed(1))
    for a, b_ in zip(ref, (out.a_disc, out.a_cont, out.logp, out.value)):  # same draws as act()
        assert torch.equal(a, b_)
    # alternative's log-prob is the policy's own evaluation of it
    lp_alt, _, _ = policy.evaluate(obs, types, out.alt_disc, out.alt_cont)
    torch.testing.assert_close(out.alt_logp, lp_alt)

    is_cont = np.array([s.action_kind == "continuous" for s in plan.specs])[plan.env_type]
    n_valid = np.array([s.action_n for s in plan.specs])[plan.env_type]
    assert (out.alt_disc.numpy() < np.where(is_cont, 1, n_valid)).all()
    assert (out.alt_cont.abs() <= 1).all()

    eg = EpsilonGreedy(is_cont, n_valid, seed=2)
    eps = np.random.default_rng(3).uniform(0.05, 0.9, b)
    eg.set_epsilon(eps)
    half = b // 2
    res = [
        eg.apply(
            lo,
            hi,
            out.a_disc.numpy()[lo:hi],
            out.a_cont.numpy()[lo:hi],
            out.logp.numpy()[lo:hi],
            out.alt_disc.numpy()[lo:hi],
            out.alt_cont.numpy()[lo:hi],
            out.alt_logp.numpy()[lo:hi],
        )
        for lo, hi in ((0, half), (half, b))
    ]
    ex_disc, ex_cont, blp, explored = (np.concatenate(p) for p in zip(*res))
    assert explored.any() and (~explored).any()

    # direct computation in float64 from the policy's distributions
    with torch.no_grad():
        logits, mean = policy.dist_params(obs, types)
        probs = torch.softmax(logits, -1).numpy()
        mean = mean.numpy()
    std = math.exp(0.4)
    outside_seen = False
    for i in range(b):
        e, n = eps[i], n_valid[i]
        if is_cont[i]:
            a = ex_cont[i, :n].astype(np.float64)
            dens = np.prod(np.exp(-0.5 * ((a - mean[i, :n]) / std) ** 2) / (std * math.sqrt(2 * math.pi)))
            inside = bool((np.abs(a) <= 1).all())
            outside_seen |= not inside
            direct = math.log((1 - e) * dens + e * (0.5**n if inside else 0.0))
        else:
            direct = math.log((1 - e) * probs[i, ex_disc[i]] + e / n)
        assert blp[i] == pytest.approx(direct, rel=1e-5, abs=1e-5), i
    assert outside_seen
    # the discrete mixture is a distribution: it sums to one over the valid actions
    for i in np.flatnonzero(~is_cont)[:8]:
        log_u = uniform_logp_np(np.array([False]), np.array([n_valid[i]]))
        lps = [mixture_logp_np(np.array([math.log(probs[i, a])]), eps[i], log_u)[0] for a in range(n_valid[i])]
        assert sum(math.exp(v) for v in lps) == pytest.approx(1.0, rel=1e-9)
    # the worker's C kernel agrees with the reference formula, in numpy and in torch
    lp_exec = np.where(explored, out.alt_logp.numpy(), out.logp.numpy())
    ref = mixture_logp_np(lp_exec, eps, uniform_logp_np(is_cont, n_valid, ex_cont))
    np.testing.assert_allclose(ref, blp, rtol=1e-5, atol=1e-5)
    lu = uniform_logp_torch(torch.from_numpy(is_cont), torch.from_numpy(n_valid), torch.from_numpy(ex_cont))
    tb = mixture_logp_torch(torch.from_numpy(lp_exec), torch.from_numpy(eps), lu)
    np.testing.assert_allclose(tb.numpy(), blp, rtol=1e-5, atol=1e-5)


def test_each_type_multiplies_its_own_feature_columns_alone():
    """A type's board padding (4 state numbers in 6) and the keys it does not produce add
    nothing: the towers' input layer leaves those columns out. The policy's outputs are those of
    multiplying them, its gradients too, none reaches their weights, and a nonzero padding
    would change nothing."""
    keys = (ObsKey("state", (6,), "float32"), ObsKey("vector", (5,), "float32"))
    specs = (
        EnvSpec({"state": ((4,), "float32")}, "discrete", 2),
        EnvSpec({"state": ((6,), "float32"), "vector": ((3,), "float32")}, "discrete", 2),
        EnvSpec({"vector": ((2,), "float32")}, "continuous", 2),
    )
    env_type = np.tile(np.arange(3, dtype=np.int16), 40)
    plan = MixPlan(("s4", "s6v3", "v2"), specs, env_type, ActionSpace(2, 2), keys)
    assert feature_widths(plan, keys, 0) == (4, 9, 8)  # v2: the state columns before its vector
    torch.manual_seed(0)
    narrow = Policy(plan, keys, (16, 16)).double()
    full = Policy(plan, keys, (16, 16)).double()
    full.load_state_dict(narrow.state_dict())
    for tower in (full.critic, full.actor_disc, full.actor_cont):
        assert tower.inp.in_widths == (4, 9, 8)
        tower.inp.in_widths = (11, 11, 11)  # every column, as before
    types = torch.from_numpy(env_type.astype(np.int64))
    obs = {
        "state": torch.randn(len(types), 6, dtype=torch.float64),
        "vector": torch.randn(len(types), 5, dtype=torch.float64),
    }
    for t, spec in enumerate(specs):  # as the board holds them: zeros past each type's own values
        rows = types == t
        for k in keys:
            written = math.prod(spec.obs[k.name][0]) if k.name in spec.obs else 0
            obs[k.name][rows, written:] = 0
    a_disc, a_cont = torch.randint(0, 2, (len(types),)), torch.rand(len(types), 2, dtype=torch.float64) * 2 - 1

    def evaluated(policy, obs):
        policy.zero_grad()
        logp, entropy, value = policy.evaluate(obs, types, a_disc, a_cont)
        (logp.sum() + entropy.sum() + value.square().sum()).backward()
        return (logp, entropy, value), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    out_n, grad_n = evaluated(narrow, obs)
    out_f, grad_f = evaluated(full, obs)
    for a, b in zip(out_n, out_f):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert grad_n.keys() == grad_f.keys()
    for name in grad_n:
        torch.testing.assert_close(grad_n[name], grad_f[name], rtol=1e-10, atol=1e-12)
    for tower in ("critic", "actor_disc", "actor_cont"):
        grad = grad_n[f"{tower}.inp.weight"]
        assert not grad[0, :, 4:].any() and not grad[1, :, 9:].any() and not grad[2, :, 8:].any()
    assert grad_n["critic.inp.weight"][2, :, 6:8].all()  # v2's own vector values do train

    padded = {k: v.clone() for k, v in obs.items()}
    padded["state"][types == 0, 4:] = 7.0  # what the layer must not read
    padded["vector"][types == 1, 3:] = -3.0
    for a, b in zip(evaluated(narrow, padded)[0], out_n):
        assert torch.equal(a, b)


def test_epsilon_zero_is_exactly_on_policy_and_rate_is_respected():
    is_cont = np.zeros(1000, dtype=bool)
    n_valid = np.full(1000, 4)
    eg = EpsilonGreedy(is_cont, n_valid, seed=0)
    a = np.zeros(1000, dtype=np.int64)
    cont = np.zeros((1000, 1), dtype=np.float32)
    lp = np.random.default_rng(0).normal(-1, 0.3, 1000).astype(np.float32)
    ex, _, blp, explored = eg.apply(0, 1000, a, cont, lp, a + 1, cont, lp - 1)
    assert ex is a and not explored.any() and np.array_equal(blp, lp)
    eg.set_epsilon(np.full(500, 0.3), lo=500)
    _, _, blp, explored = eg.apply(0, 1000, a, cont, lp, a + 1, cont, lp - 1)
    assert not explored[:500].any() and np.array_equal(blp[:500], lp[:500])
    assert 0.2 < explored[500:].mean() < 0.4
    lo, eps = unpack_epsilons(pack_epsilons(500, np.full(500, 0.3)))
    assert lo == 500 and len(eps) == 500 and eps[0] == np.float32(0.3)
    with pytest.raises(ValueError):
        unpack_epsilons(pack_epsilons(0, np.ones(3))[:-1])


def test_weighted_ppo_terms():
    g = torch.Generator().manual_seed(0)
    B = 64
    t = {k: torch.randn(B, generator=g) for k in ("new_logp", "old_logp", "new_value", "old_value", "adv", "ret")}
    t["new_logp"] = t["old_logp"] + 0.3 * torch.randn(B, generator=g)
    t["entropy"] = torch.rand(B, generator=g)
    plain = weighted_ppo_terms(**t, clip_coef=0.2)
    ratio = (t["new_logp"] - t["old_logp"]).exp()
    ref_pg = torch.max(-t["adv"] * ratio, -t["adv"] * ratio.clamp(0.8, 1.2)).mean()
    # CleanRL's surrogate; summed in double by the native pass (rlpipe/learner/ppo_kernels.py)
    torch.testing.assert_close(plain.pg_loss, ref_pg, rtol=1e-6, atol=1e-7)
    ones = weighted_ppo_terms(**t, clip_coef=0.2, weights=torch.ones(B))
    torch.testing.assert_close(ones.pg_loss, plain.pg_loss)
    torch.testing.assert_close(ones.v_loss, plain.v_loss)
    torch.testing.assert_close(ones.entropy, plain.entropy)
    w = torch.rand(B, generator=g) * 0.7 + 0.3
    a = weighted_ppo_terms(**t, clip_coef=0.2, weights=w)
    b = weighted_ppo_terms(**t, clip_coef=0.2, weights=w * 3.0)  # normalized by the weight sum
    torch.testing.assert_close(a.pg_loss, b.pg_loss)
    mask = torch.zeros(B)
    mask[:10] = 1.0  # zero weight drops a sample
    sub = weighted_ppo_terms(**{k: v[:10] for k, v in t.items()}, clip_coef=0.2, clip_vloss=False)
    part = weighted_ppo_terms(**t, clip_coef=0.2, clip_vloss=False, weights=mask)
    torch.testing.assert_close(part.v_loss, sub.v_loss)
    torch.testing.assert_close(part.entropy, sub.entropy)
    # gradients flow through the weighted terms
    lp = t["new_logp"].clone().requires_grad_()
    weighted_ppo_terms(**{**t, "new_logp": lp}, clip_coef=0.2, weights=w).pg_loss.backward()
    assert lp.grad is not None and lp.grad.abs().sum() > 0


# -- checkpoints ---------------------------------------------------------------------------------


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-5)


def _train_step(model, opt, g):
    x = torch.randn(16, 5, generator=g)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def test_checkpoint_round_trip_bit_exact(tmp_path):
    model, opt = _model_and_opt()
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        _train_step(model, opt, gen)
    np_rng = np.random.default_rng(11)
    np_rng.random(5)
    norm = RewardNormalizer(4, "per_env", CLIP, GAMMA)
    norm.normalize(0, 4, np.array([1.0, 2.0, -3.0, 1e8]))
    random.random()
    np.random.seed(5)
    np.random.normal()  # leaves a cached gaussian in numpy's legacy state
    payload = {
        "policy": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
        "counters": {"env_steps": 123456789012, "updates": 42, "episodes": 7},
        "reward_norm": {"w0": norm.state()},
        "rng": rng_state({"learner": np_rng}, {"ppo": gen}),
    }
    path = save_checkpoint(tmp_path / "checkpoints", 1000, payload, keep=3)
    assert path.name == "ckpt_000000001000.pt"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [path.name]  # no temp left
    # what the run draws next, after the save
    expect = (random.random(), np.random.normal(), torch.rand(3), np_rng.random(3), torch.rand(3, generator=gen))
    _train_step(model, opt, torch.Generator().manual_seed(9))
    params_after = [p.detach().clone() for p in model.parameters()]

    # resume in a "new process": fresh objects, scrambled RNGs
    random.seed(999)
    np.random.seed(999)
    torch.manual_seed(999)
    model2, opt2 = _model_and_opt()
    np_rng2, gen2 = np.random.default_rng(0), torch.Generator().manual_seed(0)
    loaded_path, p = load_latest(tmp_path / "checkpoints")
    assert loaded_path == path
    model2.load_state_dict(p["policy"])
    opt2.load_state_dict(p["optimizer"])
    for k, v in payload["policy"].items():
        assert torch.equal(p["policy"][k], v)
    assert p["counters"] == payload["counters"]
    norm2 = RewardNormalizer(4, "per_env", CLIP, GAMMA)
    norm2.load(p["reward_norm"]["w0"])
    assert norm2.state() == norm.state()
    set_rng_state(p["rng"], {"learner": np_rng2}, {"ppo": gen2})
    got = (random.random(), np.random.normal(), torch.rand(3), np_rng2.random(3), torch.rand(3, generator=gen2))
    assert got[0] == expect[0] and got[1] == expect[1]
    assert torch.equal(got[2], expect[2]) and np.array_equal(got[3], expect[3])
    assert torch.equal(got[4], expect[4])
    # the optimizer continues exactly as the original did
    _train_step(model2, opt2, torch.Generator().manual_seed(9))
    for a, b in zip(model2.parameters(), params_after):
        assert torch.equal(a, b)


def test_checkpoint_keep_last_k(tmp_path):
    stale = tmp_path / ".ckpt_000000000005.pt.999999999.1.tmp"  # left by a writer killed mid-save
    stale.write_bytes(b"partial")
    for step in (10, 20, 30, 40, 50):
        save_checkpoint(tmp_path, step, {"step": torch.tensor(step)}, keep=3)
    assert [p.name for p in checkpoint_files(tmp_path)] == [
        "ckpt_000000000030.pt",
        "ckpt_000000000040.pt",
        "ckpt_000000000050.pt",
    ]
    path, payload = load_latest(tmp_path)
    assert path.name.endswith("50.pt") and int(payload["step"]) == 50
    assert not stale.exists()
    assert load_latest(tmp_path / "missing") is None


def test_corrupt_checkpoint_falls_back_then_clear_error(tmp_path, caplog):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"w": torch.full((4,), float(step))}, keep=5)
    files = checkpoint_files(tmp_path)
    files[2].write_bytes(b"not a checkpoint at all")  # newest: garbage
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 2])  # middle: truncated
    path, payload = load_latest(tmp_path)
    assert path == files[0] and torch.equal(payload["w"], torch.full((4,), 1.0))
    assert "ckpt_000000000003.pt" in caplog.text and "ckpt_000000000002.pt" in caplog.text
    assert sorted(p.name for p in tmp_path.glob("*.bad")) == ["ckpt_000000000002.pt.bad", "ckpt_000000000003.pt.bad"]
    assert checkpoint_files(tmp_path) == [files[0]]

    # every file bad: one clear error naming each file and why
    torch.save({"something": "else"}, tmp_path / "ckpt_000000000009.pt")  # not an rlpipe file

    def reject(payload):
        raise ValueError("policy shape [4] does not match this run's [8]")

    with pytest.raises(CheckpointError) as err:
        load_latest(tmp_path, validate=reject, quarantine=False)
    msg = str(err.value)
    assert "ckpt_000000000009.pt is not an rlpipe checkpoint" in msg
    assert "ckpt_000000000001.pt is incompatible with this run" in msg and "does not match" in msg
    assert "2 tried" in msg
    # quarantine=False left the files in place
    assert len(checkpoint_files(tmp_path)) == 2


def test_the_cnn_meets_a_bounded_ladder_of_batch_sizes_and_padding_changes_nothing():
    """oneDNN caches a primitive per input shape: the encoder pads its rows to `padded_rows`
    so a run of every batch size from 1 to 2,000 shows the conv stack at most 41 shapes,
    and the padded rows change neither the features nor the gradients of the real ones."""
    from rlpipe.learner.rgb_encoder import RgbEncoder, padded_rows

    assert all(n <= padded_rows(n) <= max(8, n * 1.125 + 8) for n in range(1, 9000))
    torch.manual_seed(0)
    enc = RgbEncoder((36, 36, 3), (4, 8, 8), 16)
    shapes = set()
    enc.conv.register_forward_pre_hook(lambda _m, args: shapes.add(args[0].shape[0]))
    with torch.no_grad():
        for n in range(1, 2001, 7):
            enc(torch.zeros(n, 36, 36, 3, dtype=torch.uint8))
    assert len(shapes) <= 41, sorted(shapes)  # the ladder up to 2,000 (without it: 286)

    rgb = torch.randint(0, 256, (13, 36, 36, 3), dtype=torch.uint8)
    out = enc(rgb)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in enc.parameters()]
    enc.zero_grad()
    ref = enc.fc(enc.conv(rgb.permute(0, 3, 1, 2).float() / 255.0))  # unpadded: 13 rows
    ref.square().sum().backward()
    assert out.shape == (13, 16) and torch.allclose(out, ref, atol=1e-6)
    assert all(torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, enc.parameters()))
