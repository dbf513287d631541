# cython: language_level=3, boundscheck=False, wraparound=False
"""PPO's kernels of ppokernels.h, callable from Python on the addresses of CPU tensors.

The caller (rlpipe/learner/ppo_kernels.py) passes `data_ptr()`s of contiguous float32 (logits,
activations, a minibatch's rows) and int64 (actions) CPU tensors of the sizes given, and keeps
the tensors alive for the call: nothing here can check an address. Each call releases the GIL (the driver
serves while an update thread trains).
"""
from libc.stdint cimport int64_t, uintptr_t


cdef extern from "ppokernels.h":
    void tanh_inplace(float *x, int64_t n) nogil
    void bias_tanh_inplace(float *x, const float *bias, int64_t rows, int64_t cols) nogil
    void tanh_backward(const float *grad, const float *y, float *out, int64_t n) nogil
    int64_t categorical_forward(const float *logits, const int64_t *actions, int64_t rows, int64_t k,
                                float *logp, float *entropy, float *lse) nogil
    int64_t categorical_sample(const float *logits, const float *uniform, int64_t rows, int64_t k,
                               int64_t *action, float *logp, float *lse) nogil
    void categorical_backward(const float *logits, const int64_t *actions, const float *lse,
                              const float *entropy, const float *d_logp, const float *d_entropy,
                              int64_t rows, int64_t k, float *d_logits) nogil


def tanh_(uintptr_t x, int64_t n):
    """tanh of n floats at x, in place."""
    with nogil:
        tanh_inplace(<float *>x, n)


def bias_tanh_(uintptr_t x, uintptr_t bias, int64_t rows, int64_t cols):
    """tanh(x + bias) in place over [rows, cols] floats at x, bias one float a column."""
    with nogil:
        bias_tanh_inplace(<float *>x, <const float *>bias, rows, cols)


def tanh_grad(uintptr_t grad, uintptr_t y, uintptr_t out, int64_t n):
    """out = grad * (1 - y^2), n floats each."""
    with nogil:
        tanh_backward(<const float *>grad, <const float *>y, <float *>out, n)


def categorical(uintptr_t logits, uintptr_t actions, int64_t rows, int64_t k, uintptr_t logp,
                uintptr_t entropy, uintptr_t lse):
    """Per row of [rows, k] logits: the log-prob of its action, the entropy and the
    log-normalizer (entropy, lse: 0 for none wanted; the entropy's sum is skipped then). Returns the count of actions outside
    [0, k)."""
    cdef int64_t bad
    with nogil:
        bad = categorical_forward(<const float *>logits, <const int64_t *>actions, rows, k, <float *>logp,
                                  <float *>entropy, <float *>lse)
    return bad


def categorical_draw(uintptr_t logits, uintptr_t uniform, int64_t rows, int64_t k, uintptr_t action,
                     uintptr_t logp, uintptr_t lse):
    """Per row of [rows, k] logits: an action drawn by inverse CDF at the row's uniform, its
    log-prob and the row's log-normalizer. Returns the count of rows with a NaN or an
    infinity in their logits."""
    cdef int64_t bad
    with nogil:
        bad = categorical_sample(<const float *>logits, <const float *>uniform, rows, k, <int64_t *>action,
                                 <float *>logp, <float *>lse)
    return bad


def categorical_grad(uintptr_t logits, uintptr_t actions, uintptr_t lse, uintptr_t entropy, uintptr_t d_logp,
                     uintptr_t d_entropy, int64_t rows, int64_t k, uintptr_t d_logits):
    """The [rows, k] logits' gradient from the log-prob's and the entropy's (0: none)."""
    with nogil:
        categorical_backward(<const float *>logits, <const int64_t *>actions, <const float *>lse,
                             <const float *>entropy, <const float *>d_logp, <const float *>d_entropy, rows, k,
                             <float *>d_logits)


cdef extern from "ppokernels.h":
    double ppo_terms_forward(const float *nl, const float *ent, const float *nv, const float *ol, const float *ov,
                             const float *adv, const float *ret, const float *w, int64_t n, float clip,
                             int clip_vloss, double *out) nogil
    void ppo_terms_backward(const float *nl, const float *nv, const float *ol, const float *ov, const float *adv,
                            const float *ret, const float *w, int64_t n, float clip, int clip_vloss, double wsum,
                            float g_pg, float g_v, float g_h, float *d_nl, float *d_ent, float *d_nv) nogil


def ppo_terms(uintptr_t nl, uintptr_t ent, uintptr_t nv, uintptr_t ol, uintptr_t ov, uintptr_t adv, uintptr_t ret,
              uintptr_t w, int64_t n, float clip, bint clip_vloss):
    """PPO's loss terms of n rows: ((pg, v, entropy, approx_kl, clipfrac), the weight sum)."""
    cdef double out[5]
    cdef double wsum
    with nogil:
        wsum = ppo_terms_forward(<const float *>nl, <const float *>ent, <const float *>nv, <const float *>ol,
                                 <const float *>ov, <const float *>adv, <const float *>ret, <const float *>w, n,
                                 clip, clip_vloss, out)
    return (out[0], out[1], out[2], out[3], out[4]), wsum


def ppo_terms_grad(uintptr_t nl, uintptr_t nv, uintptr_t ol, uintptr_t ov, uintptr_t adv, uintptr_t ret,
                   uintptr_t w, int64_t n, float clip, bint clip_vloss, double wsum, float g_pg, float g_v,
                   float g_h, uintptr_t d_nl, uintptr_t d_ent, uintptr_t d_nv):
    """The rows' gradients of the three differentiable terms."""
    with nogil:
        ppo_terms_backward(<const float *>nl, <const float *>nv, <const float *>ol, <const float *>ov,
                           <const float *>adv, <const float *>ret, <const float *>w, n, clip, clip_vloss, wsum,
                           g_pg, g_v, g_h, <float *>d_nl, <float *>d_ent, <float *>d_nv)
