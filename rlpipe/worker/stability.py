"""Per-env stability score and the worker's epsilon-greedy exploration (numpy only: the worker
has no torch). Both are vectorized over a slice of envs [lo, hi) of one worker.

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
  1.0, a scalar or one value per env) is the reward size considered normal; the article's
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

Epsilon-greedy (executed action and behaviour log-prob)
------------------------------------------------------
The learner writes, per env, the policy's sampled action a_pi with log pi(a_pi), and one
uniformly drawn alternative a_u with log pi(a_u) (one extra action and one float: the full
distribution is never needed). With probability eps (its env's latest exploration rate) the
worker executes a_u instead of a_pi, so the behaviour policy is the mixture
mu = (1 - eps) pi + eps U, and it reports the executed action with

    log mu(a) = log((1 - eps) pi(a) + eps u(a))      (logaddexp, float64)

where u(a) = 1 / n_valid for a discrete env (n_valid: that env type's action count), and for a
continuous env the uniform density over [-1, 1]^d of its d valid dims: 2^-d if every valid dim
of a lies in [-1, 1], else 0. The behaviour distribution lives on the unclipped action space:
a Gaussian sample outside the cube (which the env then clips) has u(a) = 0 and
log mu = log(1 - eps) + log pi(a); the stored and re-evaluated action is the unclipped one,
as in CleanRL. eps = 0 returns log pi bit for bit.
"""
from __future__ import annotations

import math
import struct

import numpy as np

LOG2 = math.log(2.0)


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


# -- exploration ---------------------------------------------------------------------------------

def uniform_logp(is_cont: np.ndarray, n_valid: np.ndarray, a_cont: np.ndarray | None = None) -> np.ndarray:
    """log u(a) of the exploration uniform: -log(n_valid) for discrete envs; for continuous
    envs -d log 2 when the valid dims of a_cont [m, D] lie in [-1, 1], else -inf."""
    is_cont = np.asarray(is_cont, dtype=bool)
    n_valid = np.asarray(n_valid, dtype=np.float64)
    out = -np.log(np.maximum(n_valid, 1.0))
    if is_cont.any():
        if a_cont is None:
            raise ValueError("continuous envs need a_cont to evaluate the uniform density")
        a = np.asarray(a_cont).reshape(len(is_cont), -1)
        dims = np.arange(a.shape[1]) < n_valid[:, None]
        inside = ((np.abs(a) <= 1.0) | ~dims).all(axis=1)
        out = np.where(is_cont, np.where(inside, -n_valid * LOG2, -np.inf), out)
    return out


def mixture_logp(policy_logp: np.ndarray, epsilon: np.ndarray | float, log_u: np.ndarray) -> np.ndarray:
    """log((1 - eps) exp(policy_logp) + eps exp(log_u)) in float64; exactly policy_logp
    where eps == 0."""
    lp = np.asarray(policy_logp, dtype=np.float64)
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), lp.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        mixed = np.logaddexp(np.log1p(-eps) + lp, np.log(eps) + np.asarray(log_u, dtype=np.float64))
    return np.where(eps > 0, mixed, lp)


class EpsilonGreedy:
    """The worker's exploration over its envs [0, n): per-env rates from the learner's
    pub/sub channel, applied to the action pair the learner wrote."""

    def __init__(self, is_cont: np.ndarray, n_valid: np.ndarray, seed: int):
        """is_cont [n] bool: env uses the continuous head; n_valid [n]: its type's discrete
        action count, or its number of valid continuous dims."""
        self.is_cont = np.asarray(is_cont, dtype=bool).copy()
        self.n_valid = np.asarray(n_valid, dtype=np.int64).copy()
        if (self.n_valid < 1).any():
            raise ValueError("every env needs n_valid >= 1")
        self.n = len(self.is_cont)
        self.epsilon = np.zeros(self.n, dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self._log_u_disc = -np.log(self.n_valid.astype(np.float64))
        self._log_u_cont = -self.n_valid.astype(np.float64) * LOG2
        self._dims: dict[int, np.ndarray] = {}     # D -> [n, D] valid-dim mask of continuous envs

    def set_epsilon(self, epsilon: np.ndarray | float, lo: int = 0) -> None:
        """Rates for envs [lo, lo + len(epsilon)) (a scalar: every env), clipped to [0, 1]."""
        eps = np.asarray(epsilon, dtype=np.float64)
        if eps.ndim == 0:
            self.epsilon[:] = np.clip(eps, 0.0, 1.0)
        else:
            self.epsilon[lo:lo + len(eps)] = np.clip(eps, 0.0, 1.0)

    def apply(self, lo: int, hi: int, a_disc: np.ndarray, a_cont: np.ndarray, logp: np.ndarray,
              alt_disc: np.ndarray, alt_cont: np.ndarray, alt_logp: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Envs [lo, hi): per env pick the uniform alternative with probability eps.

        In: the learner's policy action (a_disc [m], a_cont [m, D], logp [m]) and its uniform
        alternative (alt_disc, alt_cont, alt_logp = log pi(alt)). Out: executed (a_disc,
        a_cont), behaviour log-prob float32 [m], explored bool [m]. With every eps 0 the
        inputs come back as they are (logp unchanged, no random draw)."""
        eps = self.epsilon[lo:hi]
        m = hi - lo
        if not eps.any():
            return a_disc, a_cont, np.asarray(logp, dtype=np.float32), np.zeros(m, dtype=bool)
        explored = self.rng.random(m) < eps
        ex_disc = np.where(explored, alt_disc, a_disc)
        ex_cont = np.where(explored[:, None], alt_cont, a_cont) if np.ndim(a_cont) == 2 else a_cont
        pi_logp = np.where(explored, alt_logp, logp)
        log_u = self._log_u_disc[lo:hi]
        is_cont = self.is_cont[lo:hi]
        if is_cont.any():                          # u(a) = 2^-d inside [-1, 1]^d, else 0
            D = ex_cont.shape[1]
            dims = self._dims.get(D)
            if dims is None:
                dims = self._dims[D] = (np.arange(D) < self.n_valid[:, None]) & self.is_cont[:, None]
            outside = ((np.abs(ex_cont) > 1.0) & dims[lo:hi]).any(axis=1)
            log_u = np.where(is_cont, np.where(outside, -np.inf, self._log_u_cont[lo:hi]), log_u)
        return ex_disc, ex_cont, mixture_logp(pi_logp, eps, log_u).astype(np.float32), explored


# -- the exploration-rate message (learner -> workers over Redis pub/sub) -------------------------

_EPS_HEADER = struct.Struct("<4sII")       # magic, first env id, count
_EPS_MAGIC = b"EPS1"


def pack_epsilons(env_lo: int, epsilon: np.ndarray) -> bytes:
    """Rates of envs [env_lo, env_lo + len) as one message (float32, little-endian)."""
    eps = np.asarray(epsilon, dtype="<f4")
    return _EPS_HEADER.pack(_EPS_MAGIC, env_lo, len(eps)) + eps.tobytes()


def unpack_epsilons(data: bytes) -> tuple[int, np.ndarray]:
    """(env_lo, float32 rates) of a `pack_epsilons` message; ValueError when malformed."""
    data = bytes(data)
    if len(data) < _EPS_HEADER.size:
        raise ValueError(f"epsilon message of {len(data)} bytes is shorter than its header")
    magic, env_lo, count = _EPS_HEADER.unpack_from(data)
    if magic != _EPS_MAGIC or len(data) != _EPS_HEADER.size + 4 * count:
        raise ValueError(f"malformed epsilon message (magic {magic!r}, {len(data)} bytes for {count} rates)")
    return env_lo, np.frombuffer(data, dtype="<f4", offset=_EPS_HEADER.size).astype(np.float32)
