"""Rollout storage for every env at once, in preallocated (time x env) arrays, and GAE over
every slice whose block completes in a round in one vectorized pass.

A slice's envs step in lockstep, so a slice collects T transitions as one [T, n] block of
its columns. When the T-th reward arrives, the value of the current obs bootstraps the
block, GAE runs, and the block joins the queue of ready rollouts for the next PPO update as
a dict of flat arrays (`finish`'s layout below), t-major: transition t of env j is row t * n + j.

A slice's *first* block may be shorter (`first_len`: T - (slice ordinal mod T)): the slices
of a fleet started together then finish their blocks spread evenly over T rounds, not all in
one (a burst of many updates' worth of rollouts stalls the workers under learner.backlog=hold).

done[t] marks that the episode ended with transition t (terminated, truncated, or cut by an
env rebuild): no return flows across it. A truncated episode still bootstraps: its reward
gets gamma * V(final obs) added (the worker hands the final obs over, since the autoreset
replaced it on the board). An episode cut by an env rebuild has no final obs: it bootstraps
from V(s_t), the value of the last obs it had.

gamma and lambda are each env's type's (rlpipe/learner/type_settings.py), one per column:
the product gamma * V in float32, the trace's decay gamma * lambda in float64, the trace
carried in float64 between steps. These are the numbers the per-slice storage this replaced
computed, bit for bit (tests/test_rollout_store.py replays a recorded stream through both).

An obs key that only some types produce is stored for those envs' columns alone (`col_of`):
the others' rows are zeros on the board (a type that does not produce a key leaves it
zero-filled and masked), so neither the storage nor the PPO batch makes them. At day4 the
rgb rows are a quarter of the envs and most of the bytes.

The learner calls `observe` once per round with the round's arrays; its Python work grows with
the slices whose block completes in that round (about slices / T), not with the slices served.
"""

from __future__ import annotations

import numpy as np


def key_rows(plan, types: np.ndarray) -> dict[str, np.ndarray]:
    """For each obs key of `plan` (a MixPlan) that only some of these envs' types produce, those
    envs' rows: the storage keeps nothing for the others (a block's `obs_rows`)."""
    out = {}
    for k in plan.obs_keys:
        produces = np.array([k.name in plan.specs[t].obs for t in types])
        if not produces.all():
            out[k.name] = np.flatnonzero(produces)
    return out


class RolloutStore:
    def __init__(self, plan, T: int, n_slots: int, gamma_by_type, lam_by_type, weighted: bool):
        E = len(plan.env_type)
        self.plan, self.T, self.weighted = plan, T, weighted
        self.env_type = plan.env_type.astype(np.int64)
        # per env: its type's gamma as it multiplies a float32 value, and its trace's decay
        self.discount = np.asarray(gamma_by_type, dtype=np.float32)[self.env_type]
        self.decay = (np.asarray(gamma_by_type, dtype=np.float64) * np.asarray(lam_by_type, dtype=np.float64))[
            self.env_type
        ]
        # obs keys some envs lack: per env its column in that key's storage (-1: none)
        self.col_of: dict[str, np.ndarray] = {}
        self.obs: dict[str, np.ndarray] = {}
        for k in plan.obs_keys:
            produces = np.array([k.name in plan.specs[t].obs for t in range(len(plan.specs))])[self.env_type]
            cols = E
            if not produces.all():
                self.col_of[k.name] = np.where(produces, np.cumsum(produces) - 1, -1)
                cols = int(produces.sum())
            self.obs[k.name] = np.zeros((T, cols) + k.shape, dtype=k.dtype)
        cont = max(plan.actions.cont_dim, 1)
        self.a_disc = np.zeros((T, E), dtype=np.int64)
        self.a_cont = np.zeros((T, E, cont), dtype=np.float32)
        self.logp = np.zeros((T, E), dtype=np.float32)
        self.value = np.zeros((T, E), dtype=np.float32)
        self.reward = np.zeros((T, E), dtype=np.float32)
        self.done = np.zeros((T, E), dtype=np.bool_)
        self.weight = np.ones((T, E), dtype=np.float32) if weighted else None
        # per slot: transitions collected in its block, the block's length, whether one is open
        self.t = np.zeros(n_slots, dtype=np.int64)
        self.length = np.zeros(n_slots, dtype=np.int64)
        self.open = np.zeros(n_slots, dtype=np.bool_)
        self.slot_key_rows: dict[int, dict[str, np.ndarray]] = {}  # made once per slot

    def observe(self, rnd, ordinal, a_disc, a_cont, logp, value, final_value, behaviour=None) -> list:
        """One round (an rlpipe.protocol.Round: slots, seqs, rows, results) with
        the actions the policy took on its obs and their log-probs and values; `ordinal`: each
        ready slot's ordinal (first-block staggering); `final_value`: V(final obs) per row (NaN
        where no time limit ended an episode), or None; `behaviour`: (executed discrete,
        continuous, log-prob, weight) per row under scaling. Returns the blocks this round
        completed, with each one's row types, in the order of the round's slots."""
        slots, counts, T = rnd.slots, rnd.counts, self.T
        fresh = (rnd.seqs == 0) | ~self.open[slots]  # a (re)started worker's or a new slot's first obs
        t_row = np.repeat(self.t[slots], counts)
        going = ~np.repeat(fresh, counts)
        if going.any():
            self._outcome(rnd, going, t_row, final_value, behaviour)
        full = ~fresh & (self.t[slots] == self.length[slots])
        blocks = self._finish(rnd, np.flatnonzero(full), value) if full.any() else []
        # new blocks: the first of a slot staggered, every later one of T
        new_len = np.where(fresh, T - ordinal % T, T)
        restart = fresh | full
        self.t[slots[restart]] = 0
        self.length[slots[restart]] = new_len[restart]
        self.open[slots] = True
        t_row = np.repeat(self.t[slots], counts)
        self._step(rnd, t_row, a_disc, a_cont, logp, value)
        self.t[slots] += 1
        return blocks

    def _outcome(self, rnd, going, t_row, final_value, behaviour) -> None:
        """Reward and end flags of the transition taken at t - 1, for the rows in `going`."""
        env, t = rnd.rows[going], t_row[going] - 1
        res = rnd.results
        terminated = res["terminated"][going].astype(bool)
        truncated = res["truncated"][going].astype(bool)
        timeout = truncated & ~terminated
        boot = self.value[t, env]
        if final_value is not None:
            fv = final_value[going]
            boot = np.where(np.isnan(fv), boot, fv)
        self.reward[t, env] = res["reward"][going] + self.discount[env] * boot * timeout
        self.done[t, env] = terminated | truncated
        if behaviour is not None:
            b_disc, b_cont, b_logp, b_weight = behaviour
            self.a_disc[t, env] = b_disc[going]
            self.a_cont[t, env] = b_cont[going]
            self.logp[t, env] = b_logp[going]
            self.weight[t, env] = b_weight[going]

    def _step(self, rnd, t_row, a_disc, a_cont, logp, value) -> None:
        env = rnd.rows
        for name, arr in rnd.obs.items():
            cols = self.col_of.get(name)
            if cols is None:
                self.obs[name][t_row, env] = arr
            else:
                c = cols[env]
                has = c >= 0
                self.obs[name][t_row[has], c[has]] = arr[has]
        self.a_disc[t_row, env] = a_disc
        self.a_cont[t_row, env] = a_cont
        self.logp[t_row, env] = logp
        self.value[t_row, env] = value

    def _finish(self, rnd, done_slots: np.ndarray, value: np.ndarray) -> list:
        """GAE over the blocks of the ready slots at `done_slots` (indices into the round's
        slots), one pass per distinct block length; the blocks, in round order."""
        slots, starts, counts = rnd.slots[done_slots], rnd.starts[done_slots], rnd.counts[done_slots]
        lengths = self.length[slots]
        adv_of: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # slot -> (adv [L, n], ret [L, n])
        for L in np.unique(lengths).tolist():
            group = lengths == L
            cols = np.concatenate([np.arange(a, a + n) for a, n in zip(starts[group], counts[group])])
            env = rnd.rows[cols]
            adv, ret = self._gae(L, env, value[cols])
            at = 0
            for s, n in zip(slots[group].tolist(), counts[group].tolist()):
                adv_of[s] = (adv[:, at : at + n], ret[:, at : at + n])
                at += n
        blocks = []
        for s, a, n in zip(slots.tolist(), starts.tolist(), counts.tolist()):
            lo = int(rnd.rows[a])  # a slot's envs are consecutive env ids
            blocks.append(self._block(s, lo, n, *adv_of[s], rnd.types[a : a + n]))
        return blocks

    def _gae(self, L: int, env: np.ndarray, next_value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        value, reward, done = self.value[:L, env], self.reward[:L, env], self.done[:L, env]
        discount, decay = self.discount[env], self.decay[env]
        adv = np.zeros((L, len(env)), dtype=np.float32)
        last = np.zeros(len(env), dtype=np.float32)
        for t in reversed(range(L)):
            nonterminal = 1.0 - done[t]
            nv = next_value if t == L - 1 else value[t + 1]
            delta = reward[t] + discount * nv * nonterminal - value[t]
            last = delta + decay * nonterminal * last
            adv[t] = last
        return adv, adv + value

    def _block(self, slot: int, lo: int, n: int, adv, ret, types: np.ndarray) -> tuple[dict, np.ndarray]:
        L = len(adv)
        rows_of = self.slot_key_rows.get(slot)
        if rows_of is None:
            rows_of = self.slot_key_rows[slot] = key_rows(self.plan, types)
        obs = {}
        for name, store in self.obs.items():
            cols = self.col_of.get(name)
            if cols is None:
                part = store[:L, lo : lo + n]
            else:
                mine = cols[lo : lo + n]
                mine = mine[mine >= 0]
                part = store[:L, int(mine[0]) : int(mine[0]) + len(mine)] if len(mine) else store[:L, :0]
            obs[name] = _flat(part)
        block = {
            "obs": obs,
            "obs_rows": rows_of,  # never changed once made: shared, not copied
            "a_disc": _flat(self.a_disc[:L, lo : lo + n]),
            "a_cont": _flat(self.a_cont[:L, lo : lo + n]),
            "logp": _flat(self.logp[:L, lo : lo + n]),
            "value": _flat(self.value[:L, lo : lo + n]),
            "adv": _flat(adv),
            "ret": _flat(ret),
            "n_envs": n,
        }
        if self.weight is not None:
            block["weight"] = _flat(self.weight[:L, lo : lo + n])
        return block, np.repeat(types[None], L, 0).reshape(-1)


def _flat(part: np.ndarray) -> np.ndarray:
    """A [L, n, ...] view as a new [L * n, ...] array, t-major (one copy, never a view of the
    storage, which the next block overwrites)."""
    out = np.empty((part.shape[0] * part.shape[1],) + part.shape[2:], dtype=part.dtype)
    out.reshape(part.shape)[...] = part
    return out
