"""The worker's epsilon-greedy exploration, vectorized over a slice of envs: the rates and masks
are numpy arrays, the mixing is a C kernel (rlpipe/native/slicestats.pyx; no torch: the worker
does not import it).

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
as in CleanRL. eps = 0 returns log pi bit for bit. `EpsilonGreedy.apply` computes this in C
(rlpipe/native/slicestats.pyx) with numpy's logaddexp; tests/test_rl_blocks.py holds the formula
in numpy and in torch as the reference the kernel is checked against.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from rlpipe.native.slicestats import explore_mix

LOG2 = math.log(2.0)


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
        self._is_cont_u8 = self.is_cont.view(np.uint8)  # as the C kernel takes them
        self._dims: dict[int, np.ndarray] = {}  # D -> [n, D] valid-dim mask of continuous envs
        self._explored = np.empty(self.n, dtype=np.uint8)  # apply_slice's per-env flags (unread)

    def set_epsilon(self, epsilon: np.ndarray | float, lo: int = 0) -> None:
        """Rates for envs [lo, lo + len(epsilon)) (a scalar: every env), clipped to [0, 1]."""
        eps = np.asarray(epsilon, dtype=np.float64)
        if eps.ndim == 0:
            self.epsilon[:] = np.clip(eps, 0.0, 1.0)
        else:
            self.epsilon[lo : lo + len(eps)] = np.clip(eps, 0.0, 1.0)

    def apply_slice(self, lo: int, hi: int, acts: dict, results: dict) -> int:
        """`apply` on a worker's shared arrays: the learner's actions of envs [lo, hi) in, the
        executed ones and their behaviour log-probs into the results; how many explored.

        On the board's own arrays (int32 and float32 fields, [n, D] continuous ones) the
        kernel reads and writes them in place: `apply`'s checks, copies and temporaries took
        15 us a slice of 70 (warm caches), most of a worker's exploration cost. The same
        draws, the same kernel, the same bits (tests/test_rl_blocks.py)."""
        if 0 <= lo < hi <= self.n and _board_shaped(acts, results, self.n):
            eps = self.epsilon[lo:hi]
            if not eps.any():  # apply's on-policy answer: the learner's actions and log-probs
                for out, field in (("exec_discrete", "discrete"), ("exec_continuous", "continuous")):
                    results[out][lo:hi] = acts[field][lo:hi]
                results["behaviour_logp"][lo:hi] = acts["logp"][lo:hi]
                return 0
            D = acts["continuous"].shape[1]
            return explore_mix(
                self.rng.random(hi - lo),
                eps,
                acts["discrete"][lo:hi],
                acts["continuous"][lo:hi],
                acts["logp"][lo:hi],
                acts["alt_discrete"][lo:hi],
                acts["alt_continuous"][lo:hi],
                acts["alt_logp"][lo:hi],
                self._is_cont_u8[lo:hi],
                self._valid_dims(D)[lo:hi],
                self._log_u_disc[lo:hi],
                self._log_u_cont[lo:hi],
                results["exec_discrete"][lo:hi],
                results["exec_continuous"][lo:hi],
                results["behaviour_logp"][lo:hi],
                self._explored[lo:hi],
            )
        # not the board's arrays: apply's checks and copies (the fields in its argument order)
        ed, ec, blogp, explored = self.apply(lo, hi, *(acts[name][lo:hi] for name, _, _ in _BOARD_FIELDS))
        results["exec_discrete"][lo:hi], results["exec_continuous"][lo:hi] = ed, ec
        results["behaviour_logp"][lo:hi] = blogp
        return int(explored.sum())

    def apply(
        self,
        lo: int,
        hi: int,
        a_disc: np.ndarray,
        a_cont: np.ndarray,
        logp: np.ndarray,
        alt_disc: np.ndarray,
        alt_cont: np.ndarray,
        alt_logp: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Envs [lo, hi): per env pick the uniform alternative with probability eps.

        In: the learner's policy action (a_disc [m], a_cont [m, D], logp [m]) and its uniform
        alternative (alt_disc, alt_cont, alt_logp = log pi(alt)). Out: executed (a_disc,
        a_cont), behaviour log-prob float32 [m], explored bool [m]. With every eps 0 the
        inputs come back as they are (logp unchanged, no random draw)."""
        m = hi - lo
        if not 0 <= lo <= hi <= self.n or any(
            len(x) != m for x in (a_disc, a_cont, logp, alt_disc, alt_cont, alt_logp)
        ):
            raise ValueError(
                f"envs [{lo}, {hi}) of {self.n}, arrays of lengths "
                f"{[len(x) for x in (a_disc, a_cont, logp, alt_disc, alt_cont, alt_logp)]}"
            )
        eps = self.epsilon[lo:hi]
        if not eps.any():
            return a_disc, a_cont, np.asarray(logp, dtype=np.float32), np.zeros(m, dtype=bool)
        draw = self.rng.random(m)
        a_cont, alt_cont = (np.ascontiguousarray(np.reshape(x, (m, -1)), dtype=np.float32) for x in (a_cont, alt_cont))
        D = a_cont.shape[1]
        if alt_cont.shape[1] != D:
            raise ValueError(f"continuous actions of {D} dims but alternatives of {alt_cont.shape[1]}")
        dims = self._valid_dims(D)
        ex_disc, ex_cont = np.empty(m, dtype=np.int32), np.empty((m, D), dtype=np.float32)
        behaviour_logp, explored = np.empty(m, dtype=np.float32), np.empty(m, dtype=np.bool_)
        explore_mix(
            draw,
            eps,
            _int32(a_disc),
            a_cont,
            _float32(logp),
            _int32(alt_disc),
            alt_cont,
            _float32(alt_logp),
            self._is_cont_u8[lo:hi],
            dims[lo:hi],
            self._log_u_disc[lo:hi],
            self._log_u_cont[lo:hi],
            ex_disc,
            ex_cont,
            behaviour_logp,
            explored.view(np.uint8),
        )
        return ex_disc, ex_cont, behaviour_logp, explored

    def _valid_dims(self, D: int) -> np.ndarray:
        """[n, D] uint8: the valid dims of continuous envs (0 for discrete ones)."""
        dims = self._dims.get(D)
        if dims is None:
            dims = self._dims[D] = ((np.arange(D) < self.n_valid[:, None]) & self.is_cont[:, None]).view(np.uint8)
        return dims


# the learner's fields in `apply`'s (and the kernel's) argument order, and the executed ones
_BOARD_FIELDS = (
    ("discrete", np.int32, 1),
    ("continuous", np.float32, 2),
    ("logp", np.float32, 1),
    ("alt_discrete", np.int32, 1),
    ("alt_continuous", np.float32, 2),
    ("alt_logp", np.float32, 1),
)
_RESULT_FIELDS = (("exec_discrete", np.int32, 1), ("exec_continuous", np.float32, 2), ("behaviour_logp", np.float32, 1))


def _board_shaped(acts: dict, results: dict, n: int) -> bool:
    """Whether the fields are what the kernel takes in place (it indexes without bounds
    checks): the board's dtypes, C-contiguous, n rows, the continuous ones [n, D] of one D
    (rlpipe/shm/layout.py makes them so)."""
    for arrays, spec in ((acts, _BOARD_FIELDS), (results, _RESULT_FIELDS)):
        for name, dtype, ndim in spec:
            a = arrays[name]
            if a.dtype != dtype or a.ndim != ndim or len(a) != n or not a.flags.c_contiguous:
                return False
    D = acts["continuous"].shape[1]
    return acts["alt_continuous"].shape[1] == D == results["exec_continuous"].shape[1]


def _int32(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.int32)


def _float32(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


# -- the exploration-rate message (learner -> workers over Redis pub/sub) -------------------------

_EPS_HEADER = struct.Struct("<4sII")  # magic, first env id, count
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
