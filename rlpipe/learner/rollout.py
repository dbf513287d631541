"""One slice's rollout block and its GAE: the per-slice form of the learner's storage.

The learner keeps every env's rollout in (time x env) arrays (rollout_store.py), which make
the same blocks bit for bit (tests/test_rollout_store.py replays a stream through both). This
form, one object per slice, stays as that test's reference, the GAE unit tests' subject and
the block maker of the update benchmarks (benchmarks/ppo_update.py, driver_memory.py).

A slice's envs step in lockstep, so a slice collects T transitions as one [T, n] block.
When the T-th reward arrives, the value of the current obs bootstraps the block, GAE runs,
and the block joins the queue of ready rollouts for the next PPO update.

A slice's *first* block may be shorter (`first_len`): the learner staggers the slices'
block boundaries, so that thousands of slices started together do not all finish a block
in the same inference round (one burst of many updates' worth of rollouts, which stalls
the workers under learner.backlog=hold) but a steady share of them every round.

done[t] marks that the episode ended with transition t (terminated, truncated, or cut by an
env rebuild): no return flows across it. A truncated episode still bootstraps: its reward
gets gamma * V(final obs) added, the value of the obs the time limit stopped at (the worker
hands it over in its final-obs rows, since the autoreset replaced it on the board). An
episode cut by an env rebuild has no final obs: it bootstraps from V(s_t), the value of the
last obs it had.

gamma and lambda are the env types' (rlpipe/learner/type_settings.py): one float for the
whole slice, or one value per env column where the slice mixes types that set them
differently. Both forms compute the same numbers for a column of the same values: the
product gamma * V in float32 (what a Python float meets a float32 array as), the trace's
decay gamma * lambda in float64 (as the product of two Python floats).
"""

from __future__ import annotations

import numpy as np


class SliceRollout:
    """`key_rows`: for an obs key that only some of the slice's envs produce, the indices of
    those envs' rows. The other rows of that key are zeros on the board (a type that does not
    produce a key leaves it zero-filled and masked), so they are not stored, and the PPO batch
    does not make them either (`concat_blocks`: the policy masks them). At day4 the rgb rows
    are a quarter of the envs and most of the bytes, so this keeps three quarters of the
    rollout storage out of the driver's memory, and of every epoch's gather."""

    def __init__(
        self,
        n: int,
        T: int,
        obs_keys,
        cont_dim: int,
        weighted: bool = False,
        first_len: int | None = None,
        key_rows: dict[str, np.ndarray] | None = None,
    ):
        self.n, self.T = n, T
        self.length = first_len or T  # transitions in the block being collected
        self.key_rows = key_rows or {}
        self.obs = {
            k.name: np.zeros((T, len(self.key_rows.get(k.name, range(n)))) + k.shape, dtype=k.dtype) for k in obs_keys
        }
        self.a_disc = np.zeros((T, n), dtype=np.int64)
        self.a_cont = np.zeros((T, n, max(cont_dim, 1)), dtype=np.float32)
        self.logp = np.zeros((T, n), dtype=np.float32)
        self.value = np.zeros((T, n), dtype=np.float32)
        self.reward = np.zeros((T, n), dtype=np.float32)
        self.done = np.zeros((T, n), dtype=np.bool_)
        self.weight = np.ones((T, n), dtype=np.float32) if weighted else None
        self.t = 0

    def add_outcome(
        self,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        gamma: float | np.ndarray,
        final_value: np.ndarray | None = None,
    ) -> None:
        """Reward and end flags of the transition taken at t - 1; `final_value`: V(final obs)
        of the envs whose episode a time limit ended (NaN elsewhere), or None. `gamma`: a
        float, or one per env."""
        t = self.t - 1
        timeout = truncated.astype(bool) & ~terminated.astype(bool)
        boot = self.value[t]
        if final_value is not None:
            boot = np.where(np.isnan(final_value), boot, final_value)
        self.reward[t] = reward + _value_discount(gamma) * boot * timeout
        self.done[t] = terminated.astype(bool) | truncated.astype(bool)

    def add_step(self, obs: dict, a_disc, a_cont, logp, value) -> None:
        t = self.t
        for name, arr in obs.items():
            rows = self.key_rows.get(name)
            self.obs[name][t] = arr if rows is None else arr[rows]
        self.a_disc[t] = a_disc
        self.a_cont[t] = a_cont
        self.logp[t] = logp
        self.value[t] = value
        self.t += 1

    def add_behaviour(self, a_disc, a_cont, logp, weight) -> None:
        """What the worker actually executed at t - 1 (epsilon-greedy may have replaced the
        policy's action) with its behaviour log-prob, and the sample's stability weight."""
        t = self.t - 1
        self.a_disc[t] = a_disc
        self.a_cont[t] = a_cont
        self.logp[t] = logp
        self.weight[t] = weight

    @property
    def full(self) -> bool:
        return self.t == self.length

    def finish(self, next_value: np.ndarray, gamma: float | np.ndarray, lam: float | np.ndarray) -> dict:
        """GAE over the block (`gamma`, `lam`: floats, or one per env); returns it flattened
        to [length * n] (and its `n_envs`) and resets the slice for a block of T."""
        L = self.length
        adv = np.zeros((L, self.n), dtype=np.float32)
        last = np.zeros(self.n, dtype=np.float32)
        discount = _value_discount(gamma)
        decay = (
            gamma * lam
            if isinstance(gamma, float) and isinstance(lam, float)
            else np.asarray(gamma, dtype=np.float64) * np.asarray(lam, dtype=np.float64)
        )
        for t in reversed(range(L)):
            nonterminal = 1.0 - self.done[t]
            nv = next_value if t == L - 1 else self.value[t + 1]
            delta = self.reward[t] + discount * nv * nonterminal - self.value[t]
            last = delta + decay * nonterminal * last
            adv[t] = last
        m = L * self.n
        block = {
            "obs": {k: v[:L].reshape((L * v.shape[1],) + v.shape[2:]).copy() for k, v in self.obs.items()},
            "obs_rows": self.key_rows,  # never changed after construction: shared, not copied
            "a_disc": self.a_disc[:L].reshape(m).copy(),
            "a_cont": self.a_cont[:L].reshape(m, -1).copy(),
            "logp": self.logp[:L].reshape(m).copy(),
            "value": self.value[:L].reshape(m).copy(),
            "adv": adv.reshape(m),
            "ret": (adv + self.value[:L]).reshape(m),
            "n_envs": self.n,
        }
        if self.weight is not None:
            block["weight"] = self.weight[:L].reshape(m).copy()
        self.t = 0
        self.length = self.T
        return block


def _value_discount(gamma: float | np.ndarray) -> float | np.ndarray:
    """gamma as it multiplies a float32 value: a Python float as it is (NumPy computes the
    product in float32), per-env gammas as float32 (the same product, column by column)."""
    return gamma if isinstance(gamma, float) else np.asarray(gamma, dtype=np.float32)
