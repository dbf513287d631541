# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The worker's per-slice bookkeeping in C: the stability tracker's ring buffers and scores
(rlpipe.worker.stability), epsilon-greedy's executed action and behaviour log-prob
(rlpipe.worker.exploration) and reward_norm=per_env's step (rlpipe.worker.rewardnorm).

Those modules define the formulas and own the state; this computes them for envs [lo, hi)
in one pass each. In numpy they took some twenty array calls per slice, which a worker's
profile put on a par with stepping the slice's envs; benchmarks/step_path.py's
`ppo_bookkeeping` row times this form (docs/benchmarks.md has it beside the numpy one). The
arithmetic is the numpy form's, in float64: two-pass means and deviations over the written
part of each window, and numpy's own logaddexp.
"""
from cython cimport floating
from libc.math cimport INFINITY, exp, log, log1p, sqrt
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef double LOGE2 = 0.6931471805599453

ctypedef fused integer:
    int32_t
    int64_t


# -- stability tracker --------------------------------------------------------------------------

def tracker_update(double[:, ::1] rewards, int64_t[::1] pos, int64_t[::1] filled,
                   int64_t[::1] cur_len, double[:, ::1] lengths, uint8_t[:, ::1] cuts,
                   int64_t[::1] len_pos, int64_t[::1] len_filled, Py_ssize_t lo,
                   const floating[::1] reward, const integer[::1] ep_len, const uint8_t[::1] cut):
    """One step of envs [lo, lo + len(reward)): the reward into each env's window; an episode
    end (ep_len > 0: its length; a cut with ep_len 0: the steps since the env's last end)
    into its episode ring. `cut` may be empty (no cut reported this step)."""
    cdef Py_ssize_t m = reward.shape[0], window = rewards.shape[1], episodes = lengths.shape[1]
    cdef Py_ssize_t j, e, p
    cdef bint has_cut = cut.shape[0] > 0, cut_j
    for j in range(m):
        e = lo + j
        p = pos[e]
        rewards[e, p] = reward[j]
        pos[e] = (p + 1) % window
        if filled[e] < window:
            filled[e] += 1
        cur_len[e] += 1
        cut_j = has_cut and cut[j] != 0
        if ep_len[j] > 0 or cut_j:
            p = len_pos[e]
            lengths[e, p] = ep_len[j] if ep_len[j] > 0 else cur_len[e]
            cuts[e, p] = ep_len[j] <= 0
            len_pos[e] = (p + 1) % episodes
            if len_filled[e] < episodes:
                len_filled[e] += 1
            cur_len[e] = 0


cdef void _terms(const double[:, ::1] rewards, const int64_t[::1] filled,
                 const double[:, ::1] lengths, const uint8_t[:, ::1] cuts,
                 const int64_t[::1] len_filled, double inv_scale, Py_ssize_t e,
                 double* spread, double* len_cv, double* cut_frac) noexcept nogil:
    """Env e's reward spread, episode-length cv and cut fraction (rlpipe.worker.stability)."""
    cdef Py_ssize_t window = rewards.shape[1], episodes = lengths.shape[1], k
    cdef Py_ssize_t f = filled[e], lf = len_filled[e]
    cdef double cnt = f if f > 1 else 1.0, total = 0.0, dev, ss = 0.0
    for k in range(window):               # columns not yet written hold 0.0
        total += rewards[e, k]
    cdef double mean = total / cnt
    for k in range(f if f < window else window):     # written columns: [0, f) until full
        dev = rewards[e, k] - mean
        ss += dev * dev
    spread[0] = sqrt(ss / cnt) * inv_scale

    cdef double lcnt = lf if lf > 1 else 1.0, ltotal = 0.0, lss = 0.0, ncut = 0.0
    for k in range(episodes):             # unwritten slots hold 0 and no cut
        ltotal += lengths[e, k]
        ncut += cuts[e, k]
    cdef double lmean = ltotal / lcnt
    for k in range(lf if lf < episodes else episodes):
        dev = lengths[e, k] - lmean
        lss += dev * dev
    len_cv[0] = 0.0 if lf < 2 else sqrt(lss / lcnt) / (lmean if lmean > 1.0 else 1.0)
    cut_frac[0] = ncut / lcnt


def tracker_terms(const double[:, ::1] rewards, const int64_t[::1] filled,
                  const double[:, ::1] lengths, const uint8_t[:, ::1] cuts,
                  const int64_t[::1] len_filled, const double[::1] inv_scale, Py_ssize_t lo,
                  double[::1] spread, double[::1] len_cv, double[::1] cut_frac):
    """The three terms of envs [lo, lo + len(spread)) into the given arrays."""
    cdef Py_ssize_t j, e
    for j in range(spread.shape[0]):
        e = lo + j
        _terms(rewards, filled, lengths, cuts, len_filled, inv_scale[e], e,
               &spread[j], &len_cv[j], &cut_frac[j])


def tracker_scores(const double[:, ::1] rewards, const int64_t[::1] filled,
                   const double[:, ::1] lengths, const uint8_t[:, ::1] cuts,
                   const int64_t[::1] len_filled, const double[::1] inv_scale, Py_ssize_t lo,
                   Py_ssize_t min_steps, float neutral, float[::1] out):
    """score = (1 - c) / (1 + s_r + cv_L) of envs [lo, lo + len(out)) into `out` (float32);
    an env with fewer than `min_steps` rewards in its window gets `neutral`."""
    cdef Py_ssize_t j, e
    cdef double s, cv, c
    for j in range(out.shape[0]):
        e = lo + j
        if filled[e] < min_steps:
            out[j] = neutral
            continue
        _terms(rewards, filled, lengths, cuts, len_filled, inv_scale[e], e, &s, &cv, &c)
        out[j] = <float>((1.0 - c) / (1.0 + s + cv))


# -- epsilon-greedy ------------------------------------------------------------------------------

cdef inline double _logaddexp(double x, double y) noexcept nogil:
    """numpy's npy_logaddexp."""
    cdef double tmp
    if x == y:                 # equal infinities too, without a nan
        return x + LOGE2
    tmp = x - y
    if tmp > 0:
        return x + log1p(exp(-tmp))
    if tmp <= 0:
        return y + log1p(exp(tmp))
    return tmp                 # a nan


def explore_mix(const double[::1] draw, const double[::1] eps,
                const int32_t[::1] a_disc, const float[:, ::1] a_cont, const float[::1] logp,
                const int32_t[::1] alt_disc, const float[:, ::1] alt_cont, const float[::1] alt_logp,
                const uint8_t[::1] is_cont, const uint8_t[:, ::1] dims,
                const double[::1] log_u_disc, const double[::1] log_u_cont,
                int32_t[::1] ex_disc, float[:, ::1] ex_cont, float[::1] behaviour_logp,
                uint8_t[::1] explored):
    """Per env j: explore (take the alternative) when draw[j] < eps[j]; write the executed
    action and log((1 - eps) pi(a) + eps u(a)) (exactly log pi(a) where eps is 0). u(a):
    log_u_disc[j] for a discrete env; for a continuous one log_u_cont[j] when every valid
    dim (dims[j]) of the executed action lies in [-1, 1], else 0. Returns how many explored."""
    cdef Py_ssize_t m = draw.shape[0], D = a_cont.shape[1], j, k
    cdef Py_ssize_t n_explored = 0
    cdef bint ex, outside
    cdef double lp, log_u, e
    for j in range(m):
        ex = draw[j] < eps[j]
        explored[j] = ex
        n_explored += ex
        ex_disc[j] = alt_disc[j] if ex else a_disc[j]
        outside = False
        for k in range(D):
            ex_cont[j, k] = alt_cont[j, k] if ex else a_cont[j, k]
            if dims[j, k] and (ex_cont[j, k] > 1.0 or ex_cont[j, k] < -1.0):
                outside = True
        lp = alt_logp[j] if ex else logp[j]
        e = eps[j]
        if e > 0:
            if is_cont[j]:
                log_u = -INFINITY if outside else log_u_cont[j]
            else:
                log_u = log_u_disc[j]
            lp = _logaddexp(log1p(-e) + lp, log(e) + log_u)
        behaviour_logp[j] = <float>lp
    return n_explored


# -- reward normalization -----------------------------------------------------------------------

def reward_per_env(const floating[::1] reward, const uint8_t[::1] done, Py_ssize_t lo,
                   int64_t[::1] count, double[::1] mean, double[::1] m2, double[::1] ret,
                   double gamma, double clip, bint has_clip, double eps, float[::1] out):
    """reward_norm=per_env for one step of envs [lo, lo + len(reward)) (rlpipe.worker.
    rewardnorm): each env's discounted return G <- gamma * G + r folded into its row by
    Welford's update, the reward divided by the row's std of G (1 while it has under two
    samples), clipped to [-clip, clip] when has_clip; G restarts at 0 where done[j] (`done`
    may be empty: none ended). The operations and their order are numpy's in
    `RewardNormalizer.normalize`, one rounding each (setup.py builds with -ffp-contract=off:
    no fused multiply-add), so the results are the same bits."""
    cdef Py_ssize_t m = reward.shape[0], j, e
    cdef bint has_done = done.shape[0] > 0
    cdef double x, g, delta, scale
    cdef int64_t c
    for j in range(m):
        e = lo + j
        x = <double>reward[j]
        g = ret[e] * gamma
        g = g + x
        c = count[e] + 1
        count[e] = c
        delta = g - mean[e]
        mean[e] = mean[e] + delta / <double>c
        m2[e] = m2[e] + delta * (g - mean[e])
        if c > 1:
            scale = sqrt(m2[e] / <double>c + eps)
        else:
            scale = 1.0
        x = x / scale
        ret[e] = 0.0 if has_done and done[j] else g
        if has_clip:
            if x < -clip:
                x = -clip
            elif x > clip:
                x = clip
        out[j] = <float>x
