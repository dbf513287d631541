"""RolloutStore, the learner's (time x env) rollout arrays, against SliceRollout, the per-slice
storage it replaced on the hot path: a recorded stream of rounds (slices ready in any order and
subset, restarts, time-limit truncations with final values, epsilon's executed actions and
weights, per-type gamma and lambda, keys some types lack) gives the same blocks, in the same
order, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_cfg
from rlpipe.config import run_spec
from rlpipe.envs.registry import plan_mix
from rlpipe.learner.rollout import SliceRollout
from rlpipe.learner.rollout_store import RolloutStore, key_rows
from rlpipe.learner.type_settings import TypeSettings
from rlpipe.protocol import Round, slice_bounds


def _slots(env_count: int, group: int, slices: int) -> list[tuple[int, int]]:
    """(env_lo, env_hi) of every slot: groups of `group` envs cut into `slices` slices."""
    out = []
    for g in range(0, env_count, group):
        n = min(group, env_count - g)
        out += [(g + lo, g + hi) for lo, hi in slice_bounds(n, slices)]
    return out


def _stream(plan, slots, T, rounds, seed):
    """Rounds as the driver serves them: (ready slots in ringing order, their seqs, the data
    each row carries)."""
    rng = np.random.default_rng(seed)
    seq = np.zeros(len(slots), dtype=np.int64)
    for _ in range(rounds):
        ready = rng.permutation(len(slots))[: rng.integers(1, len(slots) + 1)]
        seqs = []
        for s in ready:
            if seq[s] > 0 and rng.random() < 0.03:
                seq[s] = 0  # the worker was replaced: its first obs again
            seqs.append(seq[s])
            seq[s] += 1
        rows = np.concatenate([np.arange(*slots[s]) for s in ready])
        n = len(rows)
        types = plan.env_type[rows].astype(np.int64)
        obs = {}
        for k in plan.obs_keys:
            x = rng.normal(size=(n,) + k.shape).astype(k.dtype)
            x[[k.name not in plan.specs[t].obs for t in types]] = 0  # the board's zeros
            obs[k.name] = x
        truncated = (rng.random(n) < 0.05).astype(np.uint8)
        terminated = (rng.random(n) < 0.03).astype(np.uint8)
        final_value = np.where(truncated.astype(bool) & (rng.random(n) < 0.7), rng.normal(size=n), np.nan)
        yield {
            "ready": np.array(ready, dtype=np.int64),
            "seqs": np.array(seqs, dtype=np.int64),
            "rows": rows,
            "types": types,
            "obs": obs,
            "reward": rng.normal(size=n).astype(np.float32),
            "terminated": terminated,
            "truncated": truncated,
            "final_value": final_value.astype(np.float32),
            "a_disc": rng.integers(0, 4, n),
            "a_cont": rng.normal(size=(n, max(plan.actions.cont_dim, 1))).astype(np.float32),
            "logp": rng.normal(size=n).astype(np.float32),
            "value": rng.normal(size=n).astype(np.float32),
            "behaviour": (
                rng.integers(0, 4, n).astype(np.int32),
                rng.normal(size=(n, max(plan.actions.cont_dim, 1))).astype(np.float32),
                rng.normal(size=n).astype(np.float32),
                (0.3 + 0.7 * rng.random(n)).astype(np.float32),
            ),
        }


def _by_slices(plan, settings, slots, T, stream):
    """The blocks as the learner made them with one SliceRollout per slice (central.py at
    e1371b0, `serve`'s rollout part)."""
    rollouts, blocks = {}, []
    for r in stream:
        at = 0
        for s, seq in zip(r["ready"].tolist(), r["seqs"].tolist()):
            n = slots[s][1] - slots[s][0]
            sl = slice(at, at + n)
            at += n
            types = r["types"][sl]
            gamma, lam = settings.gae(types)
            ro = rollouts.get(s)
            if ro is None or seq == 0:
                ro = rollouts[s] = SliceRollout(
                    n,
                    T,
                    plan.obs_keys,
                    plan.actions.cont_dim,
                    True,
                    first_len=T - s % T,
                    key_rows=key_rows(plan, types),
                )
            else:
                fv = r["final_value"][sl]
                ro.add_outcome(r["reward"][sl], r["terminated"][sl], r["truncated"][sl], gamma, fv)
                ro.add_behaviour(*(b[sl] for b in r["behaviour"]))
            if ro.full:
                length = ro.length
                blocks.append((ro.finish(r["value"][sl], gamma, lam), np.repeat(types[None], length, 0).reshape(-1)))
            ro.add_step(
                {k: v[sl] for k, v in r["obs"].items()}, r["a_disc"][sl], r["a_cont"][sl], r["logp"][sl], r["value"][sl]
            )
    return blocks


def _by_store(plan, settings, slots, T, stream):
    gammas, lams = settings.gamma, settings.gae_lambda
    store = RolloutStore(plan, T, len(slots), gammas, lams, weighted=True)
    counts_of = np.array([hi - lo for lo, hi in slots], dtype=np.int64)
    blocks = []
    for r in stream:
        counts = counts_of[r["ready"]]
        ends = np.cumsum(counts)
        rnd = Round(
            slots=r["ready"],
            seqs=r["seqs"],
            starts=ends - counts,
            counts=counts,
            rows=r["rows"],
            types=r["types"],
            obs=r["obs"],
            results={"reward": r["reward"], "terminated": r["terminated"], "truncated": r["truncated"]},
            stepped=np.repeat(r["seqs"] > 0, counts),
            final_rows=np.zeros(0, dtype=np.int64),
            final_obs={},
            torn_retries=0,
        )
        blocks += store.observe(
            rnd, r["ready"], r["a_disc"], r["a_cont"], r["logp"], r["value"], r["final_value"], r["behaviour"]
        )
    return blocks


@pytest.mark.parametrize("stage", ["day4", "classic"])
def test_the_store_makes_the_per_slice_blocks_bit_for_bit(stage):
    overrides = {
        "day4": ["+stage=day4", "env_count=350"],  # 12 types, rgb for some, per-type gamma/lambda
        "classic": ["env_mix=classic", "env_count=96", "buffer=lowdim"],
    }[stage]
    spec = run_spec(compose_cfg(overrides))
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    settings = TypeSettings.of(spec.learner, spec.env_types)
    slots = _slots(spec.env_count, 70 if stage == "day4" else 24, 3)
    T = 5
    old = _by_slices(plan, settings, slots, T, _stream(plan, slots, T, 40, seed=7))
    new = _by_store(plan, settings, slots, T, _stream(plan, slots, T, 40, seed=7))
    assert len(new) == len(old) > 20
    for (a, ta), (b, tb) in zip(old, new):
        assert np.array_equal(ta, tb)
        assert a.keys() == b.keys()
        for key in a:
            if key == "obs":
                assert a["obs"].keys() == b["obs"].keys()
                for k in a["obs"]:
                    assert a["obs"][k].dtype == b["obs"][k].dtype and np.array_equal(a["obs"][k], b["obs"][k]), k
            elif key == "obs_rows":
                assert a[key].keys() == b[key].keys() and all(np.array_equal(a[key][k], b[key][k]) for k in a[key])
            elif key == "n_envs":
                assert a[key] == b[key]
            else:
                assert a[key].dtype == b[key].dtype, key
                assert np.array_equal(a[key], b[key]), key
