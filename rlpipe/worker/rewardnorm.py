"""Reward normalization in the worker, vectorized over a slice of envs.

Modes (`reward_norm=`):

- ``per_env`` / ``per_type`` / ``global``: divide each reward by the running std of the
  *discounted return* G (G <- gamma * G + r, reset to 0 when an episode ends), with one
  statistic per env id, per env type (within the worker), or one for the whole worker. No
  mean is subtracted: a constant +1 reward stays +1 in sign and ordering, so the optimal
  policy of an episodic task is unchanged. This is Gymnasium's `NormalizeReward` and SB3's
  `VecNormalize`; gamma is the learner's.
- ``mean_std``: ``(r - mean_i) / (std_i + 1e-8)`` per env over the rewards themselves, the
  form of the system this project grew from (docs/origin.md). It shifts rewards, which
  changes what an episodic task rewards (CartPole's +1 becomes 0): kept for the ablation.
- ``off``: identity; no statistics are kept (zero cost).

Statistics. Rows of (count, mean, M2) in float64, one per env, per type or one; each step's
samples are folded in with Chan et al.'s parallel combine grouped by row (per_env: one sample
per row, which is Welford's update), so mixing scales from 1e-8 to 1e8 stays exact (tests
check against a float64 two-pass reference). The statistics include the step being
normalized (update first, then normalize). While a row has fewer than two samples its scale
is 1 (no spread to divide by yet).

Clip. The normalized reward is clipped to [-clip, clip] (reward_norm.clip; conf/ sets
Gymnasium's `NormalizeReward` / SB3's `VecNormalize(clip_reward=10)` value). `clip=None`
disables it.

State. `state()` packs the statistics as one compact bytes value per worker (for a Redis SET
every `reward_norm.sync_every` steps, and for checkpoints):

    header  "<4sBBHII": magic b"RWNS", version 2, mode code, 0, n_envs, rows
    body    count int64[rows], mean float64[rows], M2 float64[rows]   (little-endian)

(rows = n_envs for per_env and mean_std, the run's type count for per_type, 1 for global, 0
for off.) The running returns G are not part of it: they belong to episodes in flight, which
a restarted worker does not continue. `load()` validates everything and raises ValueError
with a clear message; a restarted worker (same env-id range) restores it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

from rlpipe.native.slicestats import reward_per_env

MODES = ("per_env", "global", "off", "per_type", "mean_std")  # index = the state's mode code
RETURN_MODES = ("per_env", "per_type", "global")
EPS = 1e-8

_MAGIC = b"RWNS"
_VERSION = 2
_HEADER = struct.Struct("<4sBBHII")
_NO_DONE = np.zeros(0, dtype=np.uint8)  # reward_per_env's `done` where no end was passed


class RewardNormalizer:
    """Running reward statistics for envs [0, n) of one worker (indices are worker-local)."""

    def __init__(self, n: int, mode: str, clip: float | None, gamma: float, type_index: np.ndarray | None = None):
        # mode, clip and gamma have no defaults: a run passes reward_norm.mode, reward_norm.clip
        # and learner.gamma (conf/ holds their one value).
        if mode not in MODES:
            raise ValueError(f"reward_norm mode must be one of {MODES}, got {mode!r}")
        if n < 1:
            raise ValueError(f"RewardNormalizer needs at least one env, got n={n}")
        if clip is not None and not clip > 0:
            raise ValueError(f"reward_norm clip must be > 0 or None, got {clip!r}")
        if mode == "per_type" and (type_index is None or len(type_index) != n):
            raise ValueError("reward_norm per_type needs the env type of each of the worker's envs")
        self.n = int(n)
        self.mode = mode
        self.clip = None if clip is None else float(clip)
        self.gamma = float(gamma)
        # env -> statistics row
        if mode == "per_type":
            self.row_of = np.asarray(type_index, dtype=np.int64)
            rows = int(self.row_of.max()) + 1
        elif mode == "global":
            self.row_of, rows = np.zeros(self.n, dtype=np.int64), 1
        else:
            self.row_of, rows = np.arange(self.n, dtype=np.int64), (0 if mode == "off" else self.n)
        self.count = np.zeros(rows, dtype=np.int64)
        self.mean = np.zeros(rows, dtype=np.float64)
        self.m2 = np.zeros(rows, dtype=np.float64)
        self.ret = np.zeros(self.n, dtype=np.float64)  # running discounted return per env

    # -- hot path ------------------------------------------------------------------------------
    def normalize(self, lo: int, hi: int, rewards: np.ndarray, done: np.ndarray | None = None) -> np.ndarray:
        """Normalize the raw rewards of envs [lo, hi) for one step (shape [hi - lo]) and fold
        them into the statistics; `done` marks envs whose episode ended with this step (their
        running return restarts). Returns float32 (mode off: the rewards as float32, possibly
        the input array itself). mean_std also takes a [T, hi - lo] block, oldest first,
        normalized with the statistics after the whole block."""
        r = np.asarray(rewards)
        if self.mode == "off":
            return r.astype(np.float32, copy=False)
        if r.shape[-1] != hi - lo or r.ndim not in (1, 2) or (r.ndim == 2 and self.mode != "mean_std"):
            raise ValueError(f"rewards of shape {r.shape} do not match envs [{lo}, {hi}) in mode {self.mode}")
        if self.mode == "per_env" and r.ndim == 1:
            return self._per_env_step(lo, hi, r, done)
        x = r.astype(np.float64)
        if self.mode == "mean_std":
            self.update(lo, hi, x)
            mean, std = self.mean[lo:hi], np.sqrt(self.m2[lo:hi] / self.count[lo:hi])
            x -= mean
            x /= std + EPS
        else:
            g = self.ret[lo:hi]  # a view: updated in place
            g *= self.gamma
            g += x
            self.update(lo, hi, g)
            rows = self.row_of[lo:hi]
            count = self.count[rows]
            scale = np.where(count > 1, np.sqrt(self.m2[rows] / np.maximum(count, 1) + EPS), 1.0)
            x /= scale
            if done is not None:
                g[np.asarray(done, dtype=bool)] = 0.0
        if self.clip is not None:
            np.clip(x, -self.clip, self.clip, out=x)
        return x.astype(np.float32)

    def _per_env_step(self, lo: int, hi: int, r: np.ndarray, done: np.ndarray | None) -> np.ndarray:
        """per_env's one step in one C call (rlpipe/native/slicestats.pyx `reward_per_env`):
        the numpy form below took some twenty array calls a slice, 12.1 us for a slice of 70
        against 5.2 us (warm caches; docs/benchmarks.md, "Reward normalization and exploration
        in place"). Same operations, same order, same bits (tests/test_rl_blocks.py checks it
        against the numpy form). The kernel indexes without bounds checks: the range and
        `done` must fit."""
        if not 0 <= lo <= hi <= self.n or (done is not None and len(done) != hi - lo):
            raise ValueError(
                f"envs [{lo}, {hi}) of a normalizer over {self.n} envs, "
                f"done of length {None if done is None else len(done)}"
            )
        if r.dtype not in (np.float32, np.float64) or not r.flags.c_contiguous:
            r = np.ascontiguousarray(r, dtype=np.float64)
        ended = _NO_DONE if done is None else np.ascontiguousarray(done, dtype=bool).view(np.uint8)
        out = np.empty(hi - lo, dtype=np.float32)
        clip = self.clip
        reward_per_env(r, ended, lo, self.count, self.mean, self.m2, self.ret, self.gamma,
                       clip or 0.0, clip is not None, EPS, out)  # fmt: skip
        return out

    def update(self, lo: int, hi: int, x: np.ndarray) -> None:
        """Fold samples of envs [lo, hi) ([m] or [T, m]) into their rows: Welford per env
        for one row per env, else Chan's parallel combine of each row's batch."""
        if self.mode in ("per_env", "mean_std"):
            self._per_env(lo, hi, x)
            return
        rows = self.row_of[lo:hi]
        nr = len(self.count)
        nb = np.bincount(rows, minlength=nr)
        seen = np.flatnonzero(nb)
        means = np.bincount(rows, weights=x, minlength=nr) / np.maximum(nb, 1)
        d = x - means[rows]
        m2b = np.bincount(rows, weights=d * d, minlength=nr)
        self._chan(seen, nb[seen], means[seen], m2b[seen])

    def _per_env(self, lo: int, hi: int, x: np.ndarray) -> None:
        if x.ndim == 1:  # one step: Welford
            count, mean, m2 = self.count[lo:hi], self.mean[lo:hi], self.m2[lo:hi]  # views
            count += 1
            delta = x - mean
            mean += delta / count
            m2 += delta * (x - mean)
            return
        mb = x.mean(axis=0)  # a [T, m] block: Chan
        self._chan(slice(lo, hi), x.shape[0], mb, ((x - mb) ** 2).sum(axis=0))

    def _chan(self, rows, nb, mb, m2b) -> None:
        """Chan's parallel combine of a batch (nb samples, mean mb, M2 m2b) into `rows`."""
        na = self.count[rows]
        n = na + nb
        delta = mb - self.mean[rows]
        self.mean[rows] += delta * (nb / n)
        self.m2[rows] += m2b + delta * delta * (na * (nb / n))
        self.count[rows] = n

    # -- statistics ----------------------------------------------------------------------------
    @property
    def std(self) -> np.ndarray:
        """Population std per row (0 where no sample yet)."""
        return np.sqrt(np.divide(self.m2, self.count, out=np.zeros_like(self.m2), where=self.count > 0))

    def stats(self) -> dict[str, float]:
        """Scalars for TensorBoard (`reward_norm/<key>`): over the rows that have samples,
        the mean of the means, mean/min/max std, total count, rows seen, and the pooled
        mean and std of every reward seen (Chan combine of the rows)."""
        seen = self.count > 0
        if not seen.any():
            return {"count": 0.0, "rows_seen": 0.0}
        std = self.std[seen]
        count, mean, var = _combine(self.count[seen], self.mean[seen], self.m2[seen])
        return {
            "count": float(count),
            "rows_seen": float(seen.sum()),
            "mean_of_means": float(self.mean[seen].mean()),
            "mean_std": float(std.mean()),
            "min_std": float(std.min()),
            "max_std": float(std.max()),
            "pooled_mean": float(mean),
            "pooled_std": float(np.sqrt(var)),
        }

    # -- persistence ---------------------------------------------------------------------------
    def state(self) -> bytes:
        """The statistics as one compact bytes value (format in the module docstring)."""
        header = _HEADER.pack(_MAGIC, _VERSION, MODES.index(self.mode), 0, self.n, len(self.count))
        return (
            header
            + self.count.astype("<i8").tobytes()
            + self.mean.astype("<f8").tobytes()
            + self.m2.astype("<f8").tobytes()
        )

    def load(self, data: bytes) -> None:
        """Restore statistics saved by `state()`; ValueError (statistics unchanged) when the
        value is malformed or belongs to another mode or env count."""
        mode, n, count, mean, m2 = _parse(data)
        if mode != self.mode:
            raise ValueError(f"reward-norm state is for mode {mode!r}, this normalizer is {self.mode!r}")
        if n != self.n:
            raise ValueError(f"reward-norm state holds {n} envs, this worker has {self.n}")
        if len(count) != len(self.count):
            raise ValueError(
                f"reward-norm state holds {len(count)} statistics rows, this worker "
                f"has {len(self.count)} (another type layout)"
            )
        self.count, self.mean, self.m2 = count, mean, m2

    @classmethod
    def from_state(cls, data: bytes, clip: float | None, gamma: float) -> "RewardNormalizer":
        """A normalizer rebuilt from a state value (the learner uses it for `stats()`); the state
        holds statistics only, so clip and gamma are the caller's (reward_norm.clip, learner.gamma)."""
        mode, n, count, mean, m2 = _parse(data)
        layout = np.full(n, len(count) - 1) if mode == "per_type" else None  # only the row count matters
        obj = cls(n, mode, clip, gamma, type_index=layout)
        obj.count, obj.mean, obj.m2 = count, mean, m2
        return obj

    @staticmethod
    def merge(states: Iterable[bytes]) -> tuple[int, float, float]:
        """Global (count, mean, population variance) of every reward behind the given state
        values (any mix of workers and modes; `off` states add nothing). Exact parallel
        combine: mean = sum(c_i m_i) / N, M2 = sum(M2_i) + sum(c_i (m_i - mean)^2)."""
        parts = [_parse(s)[2:] for s in states]
        if not parts:
            return 0, 0.0, 0.0
        count, mean, m2 = (np.concatenate(p) for p in zip(*parts))
        seen = count > 0
        if not seen.any():
            return 0, 0.0, 0.0
        return _combine(count[seen], mean[seen], m2[seen])


def _combine(count: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> tuple[int, float, float]:
    total = int(count.sum())
    c = count.astype(np.float64)
    gmean = float((c * mean).sum() / total)
    gm2 = float(m2.sum() + (c * (mean - gmean) ** 2).sum())
    return total, gmean, gm2 / total


def _parse(data: bytes) -> tuple[str, int, np.ndarray, np.ndarray, np.ndarray]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"reward-norm state must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise ValueError(f"reward-norm state is {len(data)} bytes, shorter than its {_HEADER.size}-byte header")
    magic, version, mode_code, _pad, n, rows = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"not a reward-norm state (magic {magic!r}, expected {_MAGIC!r})")
    if version != _VERSION:
        raise ValueError(f"reward-norm state version {version} is not supported (expected {_VERSION})")
    if mode_code >= len(MODES):
        raise ValueError(f"reward-norm state has unknown mode code {mode_code}")
    mode = MODES[mode_code]
    expected_rows = {"per_env": n, "mean_std": n, "global": 1, "off": 0}.get(mode, rows)
    if rows != expected_rows or (mode == "per_type" and rows == 0):
        raise ValueError(
            f"reward-norm state for mode {mode!r} over {n} envs must have {expected_rows} rows, has {rows}"
        )
    if len(data) != _HEADER.size + 24 * rows:
        raise ValueError(
            f"reward-norm state is {len(data)} bytes, expected "
            f"{_HEADER.size + 24 * rows} for {rows} rows (truncated or padded)"
        )
    body = np.frombuffer(data, dtype="<f8", offset=_HEADER.size)
    count = np.frombuffer(data, dtype="<i8", count=rows, offset=_HEADER.size).astype(np.int64)
    mean = body[rows : 2 * rows].astype(np.float64)
    m2 = body[2 * rows :].astype(np.float64)
    if (count < 0).any() or not np.isfinite(mean).all() or not np.isfinite(m2).all() or (m2 < 0).any():
        raise ValueError("reward-norm state holds invalid values (negative count or M2, NaN/inf)")
    return mode, int(n), count, mean, m2
