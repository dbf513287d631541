"""Reward normalization in the worker: Welford running mean/std per env id, vectorized.

Modes (`reward_norm=`):

- ``per_env``: one running (count, mean, M2) per env id of the worker; a reward of env i
  becomes ``clip((r - mean_i) / (std_i + 1e-8), -clip, clip)`` (the article's formula).
- ``global``: one running statistic over all envs of the worker (the learner combines the
  workers' statistics with `RewardNormalizer.merge` for TensorBoard).
- ``off``: identity; no statistics are kept (zero cost).

Numerics. Accumulators are float64 (count int64). One step adds one reward per env, which is
Welford's update done for the whole slice at once (numpy, no Python loop per env); a block of
several steps per env (`rewards` of shape [T, m]) and the `global` mode use Chan et al.'s
parallel combine of the batch's two-pass (mean, M2) into the running one. Both are stable for
reward scales from 1e-8 to 1e8 (tests check them against a float64 two-pass reference).
Statistics include the reward being normalized (update first, then normalize). `std` is the
population std sqrt(M2 / count); with one sample it is 0 and the normalized reward is 0.
Note the 1e-8 in the denominator is absolute: for rewards whose std is itself ~1e-8 the
output is shrunk (std / (std + 1e-8) = 1/2 at std = 1e-8); that is the article's formula.

Clip. The normalized reward is clipped to [-clip, clip], default 10.0, the value of
Gymnasium's `NormalizeReward` / SB3's `VecNormalize(clip_reward=10)`: a 10-sigma reward is an
outlier whose full size would dominate a PPO batch. `clip=None` disables the clip.

State. `state()` packs the statistics as one compact bytes value per worker (for a Redis
SET every `reward_norm.sync_every` steps and for checkpoints):

    header  "<4sBBHII": magic b"RWNS", version 1, mode code, 0, n_envs, rows
    body    count int64[rows], mean float64[rows], M2 float64[rows]   (little-endian)

(rows = n_envs for per_env, 1 for global, 0 for off; 16 + 24 * rows bytes: 1,696 bytes for a
70-env worker.) `load()` validates magic, version, mode, env count, length and values and
raises ValueError with a clear message; a restarted worker (same env-id range) restores it.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Iterable

import numpy as np

MODES = ("per_env", "global", "off")
EPS = 1e-8
DEFAULT_CLIP = 10.0

_MAGIC = b"RWNS"
_VERSION = 1
_HEADER = struct.Struct("<4sBBHII")


class RewardNormalizer:
    """Running reward statistics for envs [0, n) of one worker (indices are worker-local)."""

    def __init__(self, n: int, mode: str = "per_env", clip: float | None = DEFAULT_CLIP):
        if mode not in MODES:
            raise ValueError(f"reward_norm mode must be one of {MODES}, got {mode!r}")
        if n < 1:
            raise ValueError(f"RewardNormalizer needs at least one env, got n={n}")
        if clip is not None and not clip > 0:
            raise ValueError(f"reward_norm clip must be > 0 or None, got {clip!r}")
        self.n = int(n)
        self.mode = mode
        self.clip = None if clip is None else float(clip)
        rows = {"per_env": self.n, "global": 1, "off": 0}[mode]
        self.count = np.zeros(rows, dtype=np.int64)
        self.mean = np.zeros(rows, dtype=np.float64)
        self.m2 = np.zeros(rows, dtype=np.float64)

    # -- hot path ------------------------------------------------------------------------------
    def normalize(self, lo: int, hi: int, rewards: np.ndarray) -> np.ndarray:
        """Add the raw rewards of envs [lo, hi) to the statistics, return them normalized.

        `rewards`: shape [hi - lo] (one step) or [T, hi - lo] (T steps, oldest first; all T
        are normalized with the statistics after the whole block). Returns float32 of the same
        shape (mode off: the rewards as float32, possibly the input array itself).
        """
        r = np.asarray(rewards)
        if self.mode == "off":
            return r.astype(np.float32, copy=False)
        if r.shape[-1] != hi - lo or r.ndim not in (1, 2):
            raise ValueError(f"rewards of shape {r.shape} do not match envs [{lo}, {hi})")
        x = r.astype(np.float64)
        if self.mode == "per_env":
            if r.ndim == 1:
                self._welford(lo, hi, x)
            else:
                self._chan(slice(lo, hi), x.shape[0], x.mean(axis=0),
                           ((x - x.mean(axis=0)) ** 2).sum(axis=0))
            mean, std = self.mean[lo:hi], np.sqrt(self.m2[lo:hi] / self.count[lo:hi])
        else:
            self._chan_global(x)
            mean, std = float(self.mean[0]), math.sqrt(self.m2[0] / self.count[0])
        x -= mean
        x /= std + EPS
        if self.clip is not None:
            np.clip(x, -self.clip, self.clip, out=x)
        return x.astype(np.float32)

    def _welford(self, lo: int, hi: int, x: np.ndarray) -> None:
        count, mean, m2 = self.count[lo:hi], self.mean[lo:hi], self.m2[lo:hi]   # views
        count += 1
        delta = x - mean
        mean += delta / count
        m2 += delta * (x - mean)

    def _chan_global(self, x: np.ndarray) -> None:
        """`_chan` into the single global row, in Python scalars (cheaper for one row)."""
        nb = x.size
        mb = float(x.sum()) / nb
        d = (x - mb).ravel()
        m2b = float(d @ d)
        na = int(self.count[0])
        n = na + nb
        delta = mb - float(self.mean[0])
        self.mean[0] += delta * (nb / n)
        self.m2[0] += m2b + delta * delta * (na * (nb / n))
        self.count[0] = n

    def _chan(self, rows: slice, nb, mb, m2b) -> None:
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
        return {"count": float(count), "rows_seen": float(seen.sum()),
                "mean_of_means": float(self.mean[seen].mean()), "mean_std": float(std.mean()),
                "min_std": float(std.min()), "max_std": float(std.max()),
                "pooled_mean": float(mean), "pooled_std": float(np.sqrt(var))}

    # -- persistence ---------------------------------------------------------------------------
    def state(self) -> bytes:
        """The statistics as one compact bytes value (format in the module docstring)."""
        header = _HEADER.pack(_MAGIC, _VERSION, MODES.index(self.mode), 0, self.n, len(self.count))
        return header + self.count.astype("<i8").tobytes() + self.mean.astype("<f8").tobytes() \
            + self.m2.astype("<f8").tobytes()

    def load(self, data: bytes) -> None:
        """Restore statistics saved by `state()`; ValueError (statistics unchanged) when the
        value is malformed or belongs to another mode or env count."""
        mode, n, count, mean, m2 = _parse(data)
        if mode != self.mode:
            raise ValueError(f"reward-norm state is for mode {mode!r}, this normalizer is {self.mode!r}")
        if n != self.n:
            raise ValueError(f"reward-norm state holds {n} envs, this worker has {self.n}")
        self.count, self.mean, self.m2 = count, mean, m2

    @classmethod
    def from_state(cls, data: bytes, clip: float | None = DEFAULT_CLIP) -> "RewardNormalizer":
        """A normalizer rebuilt from a state value (the learner uses it for `stats()`)."""
        mode, n, count, mean, m2 = _parse(data)
        obj = cls(n, mode, clip)
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
        raise ValueError(f"reward-norm state is {len(data)} bytes, shorter than its "
                         f"{_HEADER.size}-byte header")
    magic, version, mode_code, _pad, n, rows = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"not a reward-norm state (magic {magic!r}, expected {_MAGIC!r})")
    if version != _VERSION:
        raise ValueError(f"reward-norm state version {version} is not supported (expected {_VERSION})")
    if mode_code >= len(MODES):
        raise ValueError(f"reward-norm state has unknown mode code {mode_code}")
    mode = MODES[mode_code]
    expected_rows = {"per_env": n, "global": 1, "off": 0}[mode]
    if rows != expected_rows:
        raise ValueError(f"reward-norm state for mode {mode!r} over {n} envs must have "
                         f"{expected_rows} rows, has {rows}")
    if len(data) != _HEADER.size + 24 * rows:
        raise ValueError(f"reward-norm state is {len(data)} bytes, expected "
                         f"{_HEADER.size + 24 * rows} for {rows} rows (truncated or padded)")
    body = np.frombuffer(data, dtype="<f8", offset=_HEADER.size)
    count = np.frombuffer(data, dtype="<i8", count=rows, offset=_HEADER.size).astype(np.int64)
    mean = body[rows:2 * rows].astype(np.float64)
    m2 = body[2 * rows:].astype(np.float64)
    if (count < 0).any() or not np.isfinite(mean).all() or not np.isfinite(m2).all() or (m2 < 0).any():
        raise ValueError("reward-norm state holds invalid values (negative count or M2, NaN/inf)")
    return mode, int(n), count, mean, m2
