"""Per-env stability score (numpy only: the worker has no torch), vectorized over a slice of
envs [lo, hi) of one worker.

Stability score
---------------
Per env, from the last `window` (scaling.window, default 100) rewards and the last
`episodes` (default 8) episode ends:

    s_r = std(r_window) / reward_scale            reward spread against a reference scale
    cv_L = std(L) / mean(L)                        coefficient of variation of episode lengths
    c   = cut episodes / episodes                  share of the episodes cut by a crash,
                                                   hang or quarantine (rebuild)
    score = (1 - c) / (1 + s_r + cv_L)             in [0, 1]

- std is the population std over the window (two-pass, float64). `reward_scale` (default
  1.0, a scalar or one value per env) is the reward size considered normal; the original system's
  ground truth is "95% of envs reward in [-1, 1]", so an env whose per-step rewards spread
  over +-100 scores ~0.01 and one with a constant reward scores 1. The reward term is not
  scale-free on purpose: it is there to catch envs whose raw rewards would dominate the
  gradient (feed it raw rewards, not normalized ones). Sparse rewards (a rare large reward
  among zeros) count as spread too.
- L are the lengths of the last `episodes` ended episodes. A normal end reports its length
  (the worker's `ep_len`); a cut end (crash / hang / NaN quarantine: `truncated` with
  `ep_len == 0` in EnvTable's results) counts with the steps since the env's previous end, so
  crashing envs get erratic lengths and a non-zero c. With fewer than 2 ended episodes cv_L
  is 0; with none, c is 0.
- A steady env (constant reward, equal episode lengths, no crash) scores 1; every term only
  lowers it; an env whose every episode is cut scores 0. Deterministic: no randomness.
- Too little data: an env with fewer than `min_steps` rewards in its window (default
  max(2, window // 10)) gets the neutral score `neutral` (default 1.0: the weight and
  epsilon of scaling=off, full weight until there is evidence).
"""
from __future__ import annotations

import numpy as np


def stability_score(reward_spread: np.ndarray, len_cv: np.ndarray, cut_frac: np.ndarray) -> np.ndarray:
    """score = (1 - c) / (1 + s_r + cv_L), inputs clipped to their domains; float32 in [0, 1]."""
    s_r = np.maximum(np.nan_to_num(reward_spread, nan=0.0, posinf=1e30), 0.0)
    cv = np.maximum(np.nan_to_num(len_cv, nan=0.0, posinf=1e30), 0.0)
    c = np.clip(np.nan_to_num(cut_frac, nan=0.0), 0.0, 1.0)
    return np.clip((1.0 - c) / (1.0 + s_r + cv), 0.0, 1.0).astype(np.float32)


class StabilityTracker:
    """Ring buffers of the last `window` rewards and last `episodes` episode ends per env."""

    def __init__(self, n: int, window: int = 100, episodes: int = 8, min_steps: int | None = None,
                 reward_scale: float | np.ndarray = 1.0, neutral: float = 1.0):
        if window < 2 or episodes < 2:
            raise ValueError(f"stability window and episodes must be >= 2, got {window}, {episodes}")
        if not 0.0 <= neutral <= 1.0:
            raise ValueError(f"neutral score must be in [0, 1], got {neutral}")
        self.n, self.window, self.episodes = n, window, episodes
        self.min_steps = max(2, window // 10) if min_steps is None else max(1, int(min_steps))
        scale = np.broadcast_to(np.asarray(reward_scale, dtype=np.float64), (n,)).copy()
        if not (scale > 0).all():
            raise ValueError("stability reward_scale must be > 0")
        self.inv_scale = 1.0 / scale
        self.neutral = float(neutral)
        self.rewards = np.zeros((n, window), dtype=np.float64)
        self.pos = np.zeros(n, dtype=np.int64)          # next write column
        self.filled = np.zeros(n, dtype=np.int64)       # rewards in the window (<= window)
        self.cur_len = np.zeros(n, dtype=np.int64)      # steps since the env's last episode end
        self.lengths = np.zeros((n, episodes), dtype=np.float64)
        self.cuts = np.zeros((n, episodes), dtype=np.bool_)
        self.len_pos = np.zeros(n, dtype=np.int64)
        self.len_filled = np.zeros(n, dtype=np.int64)
        self._rows = np.arange(n)
        self._cols = np.arange(window)

    def update(self, lo: int, hi: int, rewards: np.ndarray, ep_len: np.ndarray,
               cut: np.ndarray | None = None) -> None:
        """Record one step of envs [lo, hi): raw rewards [m]; ep_len [m] (> 0 where an episode
        ended normally, with its length); cut [m] bool (episode cut by crash/hang/rebuild:
        `truncated & (ep_len == 0)` in EnvTable's results) or None."""
        rows = self._rows[lo:hi]
        pos = self.pos[lo:hi]
        self.rewards[rows, pos] = rewards
        pos += 1
        pos %= self.window
        filled = self.filled[lo:hi]
        np.minimum(filled + 1, self.window, out=filled)
        cur = self.cur_len[lo:hi]
        cur += 1
        ep_len = np.asarray(ep_len)
        ended = ep_len > 0
        if cut is not None:
            ended = ended | np.asarray(cut, dtype=bool)
        if not ended.any():
            return
        j = np.flatnonzero(ended)
        e = lo + j
        lp = self.len_pos[e]
        self.lengths[e, lp] = np.where(ep_len[j] > 0, ep_len[j], cur[j])
        self.cuts[e, lp] = ep_len[j] <= 0           # ended without a normal length: a cut
        self.len_pos[e] = (lp + 1) % self.episodes
        self.len_filled[e] = np.minimum(self.len_filled[e] + 1, self.episodes)
        self.cur_len[e] = 0

    def terms(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(reward spread s_r, episode-length cv_L, cut fraction c, has-data mask) per env."""
        f = self.filled[lo:hi]
        r = self.rewards[lo:hi]
        cnt = np.maximum(f, 1).astype(np.float64)
        mean = r.sum(axis=1) / cnt                  # columns not yet written hold 0.0
        dev = r - mean[:, None]
        if (f < self.window).any():                 # partly filled windows: mask the unwritten
            dev *= self._cols < f[:, None]
        spread = np.sqrt(np.einsum("ij,ij->i", dev, dev) / cnt) * self.inv_scale[lo:hi]

        lf = self.len_filled[lo:hi]
        L = self.lengths[lo:hi]
        lcnt = np.maximum(lf, 1).astype(np.float64)
        lmean = L.sum(axis=1) / lcnt                # unwritten slots hold 0 (and no cut)
        ldev = L - lmean[:, None]
        if (lf < self.episodes).any():
            ldev *= np.arange(self.episodes) < lf[:, None]
        lstd = np.sqrt(np.einsum("ij,ij->i", ldev, ldev) / lcnt)
        len_cv = lstd / np.maximum(lmean, 1.0)      # lengths are >= 1 when recorded
        len_cv[lf < 2] = 0.0
        cut_frac = self.cuts[lo:hi].sum(axis=1) / lcnt
        return spread, len_cv, cut_frac, f >= self.min_steps

    def scores(self, lo: int, hi: int) -> np.ndarray:
        """Stability scores of envs [lo, hi): float32 in [0, 1] (formula in the module doc)."""
        spread, len_cv, cut_frac, enough = self.terms(lo, hi)
        score = ((1.0 - cut_frac) / (1.0 + spread + len_cv)).astype(np.float32)   # all terms >= 0
        score[~enough] = self.neutral
        return score
