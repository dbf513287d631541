"""Per-env stability score, vectorized over a slice of envs [lo, hi) of one worker: the ring
buffers are numpy arrays, the statistics and scores are computed by the C kernels of
rlpipe/native/slicestats.pyx (no torch: the worker does not import it).

Stability score
---------------
Per env, from the last `window` (scaling.window) rewards and the last `episodes` (default 8)
episode ends:

    s_r = std(r_window) / reward_scale            reward spread against a reference scale
    cv_L = std(L) / mean(L)                        coefficient of variation of episode lengths
    c   = cut episodes / episodes                  share of the episodes cut by a crash,
                                                   hang or quarantine (rebuild)
    score = (1 - c) / (1 + s_r + cv_L)             in [0, 1]

- std is the population std over the window (two-pass, float64; computed in C by
  rlpipe/native/slicestats.pyx). `reward_scale` (default
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

from rlpipe.native.slicestats import tracker_scores, tracker_terms, tracker_update

_NO_CUT = np.zeros(0, dtype=np.uint8)  # no cut reported this step


class StabilityTracker:
    """Ring buffers of the last `window` rewards and last `episodes` episode ends per env."""

    def __init__(
        self,
        n: int,
        window: int,
        episodes: int = 8,
        min_steps: int | None = None,
        reward_scale: float | np.ndarray = 1.0,
        neutral: float = 1.0,
    ):
        # window has no default: a run passes scaling.window (conf/ holds its one value); the
        # others are this module's own constants, no setting of conf/.
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
        self.pos = np.zeros(n, dtype=np.int64)  # next write column
        self.filled = np.zeros(n, dtype=np.int64)  # rewards in the window (<= window)
        self.cur_len = np.zeros(n, dtype=np.int64)  # steps since the env's last episode end
        self.lengths = np.zeros((n, episodes), dtype=np.float64)
        self.cuts = np.zeros((n, episodes), dtype=np.bool_)
        self.len_pos = np.zeros(n, dtype=np.int64)
        self.len_filled = np.zeros(n, dtype=np.int64)
        self._cuts_u8 = self.cuts.view(np.uint8)  # the same memory, as the C kernels take it
        # What tracker_terms and tracker_scores read, in their argument order (the arrays are
        # only ever written in place, so the tuple stays theirs).
        self._windows = (self.rewards, self.filled, self.lengths, self._cuts_u8, self.len_filled, self.inv_scale)

    def update(self, lo: int, hi: int, rewards: np.ndarray, ep_len: np.ndarray, cut: np.ndarray | None = None) -> None:
        """Record one step of envs [lo, hi): raw rewards [m]; ep_len [m] (> 0 where an episode
        ended normally, with its length); cut [m] bool (episode cut by crash/hang/rebuild:
        `truncated & (ep_len == 0)` in EnvTable's results) or None."""
        self._check(lo, hi, rewards, ep_len, *(() if cut is None else (cut,)))
        rewards = np.ascontiguousarray(rewards)
        if rewards.dtype not in (np.float32, np.float64):
            rewards = rewards.astype(np.float64)
        ep_len = np.ascontiguousarray(ep_len)
        if ep_len.dtype not in (np.int32, np.int64):
            ep_len = ep_len.astype(np.int64)
        cut = _NO_CUT if cut is None else np.ascontiguousarray(cut, dtype=np.bool_).view(np.uint8)
        tracker_update(
            self.rewards,
            self.pos,
            self.filled,
            self.cur_len,
            self.lengths,
            self._cuts_u8,
            self.len_pos,
            self.len_filled,
            lo,
            rewards,
            ep_len,
            cut,
        )

    def terms(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(reward spread s_r, episode-length cv_L, cut fraction c, has-data mask) per env."""
        self._check(lo, hi)
        spread, len_cv, cut_frac = (np.empty(hi - lo) for _ in range(3))
        tracker_terms(*self._windows, lo, spread, len_cv, cut_frac)
        return spread, len_cv, cut_frac, self.filled[lo:hi] >= self.min_steps

    def scores(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """Stability scores of envs [lo, hi): float32 in [0, 1] (formula in the module doc),
        written into `out` (float32 [hi - lo], the results board's rows) when given."""
        if out is None:
            out = np.empty(hi - lo, dtype=np.float32)
        self._check(lo, hi, out)
        tracker_scores(*self._windows, lo, self.min_steps, self.neutral, out)
        return out

    def _check(self, lo: int, hi: int, *per_env: np.ndarray) -> None:
        """The C kernels index without bounds checks: the range and the arrays must fit."""
        if not 0 <= lo <= hi <= self.n or any(len(a) != hi - lo for a in per_env):
            raise ValueError(
                f"envs [{lo}, {hi}) of a tracker over {self.n} envs, arrays of lengths {[len(a) for a in per_env]}"
            )
