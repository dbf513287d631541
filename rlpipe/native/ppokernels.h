/* Float32 kernels of PPO on a CPU learner (rlpipe/native/ppokernels.pyx, called from
   rlpipe/learner/ppo_kernels.py): the towers' tanh in place and its backward; a categorical
   head's log-prob, entropy, sampling and backward; the loss terms of a minibatch and their
   backward. Each is one pass where torch ran several ops: in a PPO minibatch of the
   CartPole-sized towers the op count, not the arithmetic, was most of what the forward and
   the loss paid for. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The loops below are plain C that GCC vectorizes; on x86-64 each exported function is built
   for AVX-512, AVX2 and the baseline, and the loader picks the widest the CPU has. Every
   process of a run on one machine then computes the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PPOKERNELS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PPOKERNELS_CLONES
#endif

#define TANH_BLOCK 16

/* e^r - 1 for v = n ln2 + r (v <= 0, already clamped at -88), with 2^n into *scale: the
   range reduction and polynomial that tanh_one and exp_nonpos share. */
static inline float exp_reduced(float v, float *scale) {
    float fn = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* n, rounded to nearest */
    float r = v - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    int32_t bits = ((int32_t)fn + 127) << 23;
    memcpy(scale, &bits, sizeof *scale);
    return p * r * r + r;
}

/* tanh(x) within 1.4 float32 ulp (8.9e-8 absolute): with v = -2|x| <= 0,
   tanh|x| = -(e^v - 1) / (1 + e^v), which has no cancellation anywhere when e^v - 1 is
   computed as such, not as e^v less 1. v = n ln2 + r with |r| <= ln2/2 (below -88 v is
   clamped: e^v is 0 in float32 there, and NaN stays NaN); e^r - 1 = r + r^2 P(r), P the
   degree-5 polynomial of Cephes' expf; then e^v - 1 = 2^n (e^r - 1) + (2^n - 1), the last term
   exact, and e^v = 2^n (e^r - 1) + 2^n. One formula for every x: no branch to vectorize, and
   about 0.8x the time of a Taylor series near 0 beside (1 - e^v) / (1 + e^v) above it, both
   computed and one kept (docs/benchmarks.md, "The tanh kernel in one formula"). */
static inline float tanh_one(float x) {
    float a = fabsf(x);
    float v = -2.0f * a;
    v = v < -88.0f ? -88.0f : v;
    float scale; /* 2^n */
    float em1_r = exp_reduced(v, &scale);
    float em1_v = em1_r * scale + (scale - 1.0f);
    float e_v = em1_r * scale + scale;
    return copysignf(-em1_v / (1.0f + e_v), x);
}

static inline void tanh_block(float *restrict x) {
    for (int i = 0; i < TANH_BLOCK; i++) x[i] = tanh_one(x[i]);
}

/* Every value goes through the same block code (a short tail is copied into a block first),
   so a value's tanh does not depend on where it sits in the array: acting over any number of
   rows and training over a minibatch compute the same bits for the same pre-activation. */
PPOKERNELS_CLONES void tanh_inplace(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + TANH_BLOCK <= n; i += TANH_BLOCK) tanh_block(x + i);
    if (i < n) {
        float tail[TANH_BLOCK] = {0};
        memcpy(tail, x + i, (size_t)(n - i) * sizeof(float));
        tanh_block(tail);
        memcpy(x + i, tail, (size_t)(n - i) * sizeof(float));
    }
}

/* tanh(x + bias) in place over [rows, cols] x, bias one value a column: a layer's activation
   from its bias-free product (so the product's output is not first filled with the bias).
   Sixteen rows at a time get their bias, then go through the 16-wide blocks while they are
   in cache; 16 x cols values are whole blocks, and the last rows go through tanh_inplace, so
   every value's tanh is tanh_inplace's, wherever it sits. */
PPOKERNELS_CLONES void bias_tanh_inplace(float *x, const float *restrict bias, int64_t rows, int64_t cols) {
    int64_t r = 0;
    for (; r < rows; r += TANH_BLOCK) {
        int64_t n_rows = rows - r < TANH_BLOCK ? rows - r : TANH_BLOCK;
        float *chunk = x + r * cols;
        for (int64_t i = 0; i < n_rows; i++) {
            float *restrict row = chunk + i * cols;
            for (int64_t c = 0; c < cols; c++) row[c] += bias[c];
        }
        if (n_rows == TANH_BLOCK) {
            for (int64_t i = 0; i < TANH_BLOCK * cols; i += TANH_BLOCK) tanh_block(chunk + i);
        } else {
            tanh_inplace(chunk, n_rows * cols);
        }
    }
}

/* tanh's backward from its output: grad * (1 - y^2) */
PPOKERNELS_CLONES void tanh_backward(const float *restrict grad, const float *restrict y, float *restrict out,
                                   int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = grad[i] * (1.0f - y[i] * y[i]);
}

/* e^x for x <= 0 (the logits less their row's largest, or less its lse): exp_reduced's
   range reduction and polynomial, e^x = 2^n (e^r - 1) + 2^n; below -88 it is 0 (float32's
   e^x is 0 or a subnormal there), and NaN stays NaN. Inline, so the blocks below vectorize it
   where libm's expf was a call per value. */
static inline float exp_nonpos(float x) {
    float v = x < -88.0f ? -88.0f : x;
    float scale;
    float em1_r = exp_reduced(v, &scale);
    float e = em1_r * scale + scale;
    return x == x ? e : x;
}

/* log(s) for s >= 1 (a row's sum of e^(l_j - max), at least the max's own 1): s = 2^e m with
   m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2/2 + f^3 P(f), f = m - 1, P Cephes' logf
   polynomial; NaN and infinity pass through (the sampler refuses a row whose lse is not
   finite). */
static inline float log_ge1(float s) {
    int32_t bits;
    memcpy(&bits, &s, sizeof bits);
    int32_t e = ((bits >> 23) & 0xff) - 126; /* s = 2^e * m, m in [0.5, 1) */
    int32_t mbits = (bits & 0x007fffff) | 0x3f000000;
    float m;
    memcpy(&m, &mbits, sizeof m);
    int low = m < 0.707106781186547524f;
    float fe = (float)(e - low);
    float f = (low ? m + m : m) - 1.0f;
    float z = f * f;
    float y = 7.0376836292E-2f;
    y = y * f - 1.1514610310E-1f;
    y = y * f + 1.1676998740E-1f;
    y = y * f - 1.2420140846E-1f;
    y = y * f + 1.4249322787E-1f;
    y = y * f - 1.6668057665E-1f;
    y = y * f + 2.0000714765E-1f;
    y = y * f - 2.4999993993E-1f;
    y = y * f + 3.3333331174E-1f;
    y = y * f * z;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    float out = f + y + 0.693359375f * fe;
    return (s == s && s < INFINITY) ? out : s;
}

/* The categorical steps below take rows sixteen at a time, each logit column j of the block
   into a 16-wide array (a last block's missing rows repeat its first row, and nothing is
   written for them), so every row goes through the same vector code: a row's results do not
   depend on how many rows are computed at once, in acting or in training. */
#define CAT_BLOCK 16

static inline int64_t cat_block_rows(int64_t r0, int64_t rows) {
    return rows - r0 < CAT_BLOCK ? rows - r0 : CAT_BLOCK;
}

static inline void cat_column(const float *logits, int64_t r0, int64_t nb, int64_t k, int64_t j, float *restrict v) {
    for (int i = 0; i < CAT_BLOCK; i++) v[i] = logits[(r0 + (i < nb ? i : 0)) * k + j];
}

/* Each block row's log-normalizer lse = m + log(sum_j e^(l_j - m)), m its largest logit: the
   one formula behind every log-prob below, so acting and training compute the same bits. */
static inline void cat_lse(const float *logits, int64_t r0, int64_t nb, int64_t k, float *restrict z) {
    float m[CAT_BLOCK], s[CAT_BLOCK], v[CAT_BLOCK];
    cat_column(logits, r0, nb, k, 0, m);
    for (int64_t j = 1; j < k; j++) {
        cat_column(logits, r0, nb, k, j, v);
        for (int i = 0; i < CAT_BLOCK; i++) m[i] = v[i] > m[i] ? v[i] : m[i];
    }
    for (int i = 0; i < CAT_BLOCK; i++) s[i] = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        cat_column(logits, r0, nb, k, j, v);
        for (int i = 0; i < CAT_BLOCK; i++) s[i] += exp_nonpos(v[i] - m[i]);
    }
    for (int i = 0; i < CAT_BLOCK; i++) z[i] = m[i] + log_ge1(s[i]);
}

/* A categorical head over `rows` rows of `k` logits (a type's masked entries are -1e9): per
   row the log-prob of its action, l_a - lse, and where `entropy` is given the entropy
   -sum_j p_j log p_j with p_j = e^(l_j - lse), an entry whose p_j is 0 adding nothing (as
   torch's Categorical); `lse` (if given) gets each row's log-normalizer. Returns the number of
   rows whose action is outside [0, k): nothing is read for them and their log-prob is NaN
   (the caller raises). */
PPOKERNELS_CLONES int64_t categorical_forward(const float *restrict logits, const int64_t *restrict actions,
                                              int64_t rows, int64_t k, float *restrict logp, float *restrict entropy,
                                              float *restrict lse) {
    int64_t bad = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += CAT_BLOCK) {
        int64_t nb = cat_block_rows(r0, rows);
        float z[CAT_BLOCK], h[CAT_BLOCK], v[CAT_BLOCK];
        cat_lse(logits, r0, nb, k, z);
        if (entropy) {
            for (int i = 0; i < CAT_BLOCK; i++) h[i] = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                cat_column(logits, r0, nb, k, j, v);
                for (int i = 0; i < CAT_BLOCK; i++) {
                    float lp = v[i] - z[i];
                    float p = exp_nonpos(lp);
                    h[i] -= p > 0.0f ? p * lp : 0.0f;
                }
            }
        }
        for (int64_t i = 0; i < nb; i++) {
            int64_t r = r0 + i, a = actions[r];
            if (a < 0 || a >= k) {
                bad++;
                logp[r] = NAN;
            } else {
                logp[r] = logits[r * k + a] - z[i];
            }
            if (entropy) entropy[r] = h[i];
            if (lse) lse[r] = z[i];
        }
    }
    return bad;
}

/* One action per row drawn from its categorical by inverse CDF: the first j whose cumulative
   p_j exceeds the row's uniform draw u in [0, 1) (where rounding leaves the total below u,
   the last action of nonzero p); with its log-prob and the row's lse. Returns the number of
   rows whose logits hold a NaN or an infinity: their action is 0 (the caller raises). */
PPOKERNELS_CLONES int64_t categorical_sample(const float *restrict logits, const float *restrict uniform,
                                             int64_t rows, int64_t k, int64_t *restrict action,
                                             float *restrict logp, float *restrict lse) {
    int64_t bad = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += CAT_BLOCK) {
        int64_t nb = cat_block_rows(r0, rows);
        float z[CAT_BLOCK], c[CAT_BLOCK], u[CAT_BLOCK], v[CAT_BLOCK];
        int32_t a[CAT_BLOCK], last[CAT_BLOCK];
        cat_lse(logits, r0, nb, k, z);
        for (int i = 0; i < CAT_BLOCK; i++) {
            u[i] = uniform[r0 + (i < nb ? i : 0)];
            c[i] = 0.0f;
            a[i] = -1;
            last[i] = 0;
        }
        for (int64_t j = 0; j < k; j++) {
            cat_column(logits, r0, nb, k, j, v);
            for (int i = 0; i < CAT_BLOCK; i++) {
                float p = exp_nonpos(v[i] - z[i]);
                last[i] = p > 0.0f ? (int32_t)j : last[i];
                c[i] += p;
                a[i] = (a[i] < 0 && u[i] < c[i]) ? (int32_t)j : a[i];
            }
        }
        for (int64_t i = 0; i < nb; i++) {
            int64_t r = r0 + i;
            lse[r] = z[i];
            if (!isfinite(z[i])) {
                bad++;
                action[r] = 0;
                logp[r] = NAN;
                continue;
            }
            int64_t ai = a[i] < 0 ? last[i] : a[i];
            action[r] = ai;
            logp[r] = logits[r * k + ai] - z[i];
        }
    }
    return bad;
}

/* The logits' gradient from the log-prob's and the entropy's (either NULL: none flows):
   d l_j = g_logp (1[j = a] - p_j) - g_entropy p_j (log p_j + H). The actions were checked in
   the forward. */
PPOKERNELS_CLONES void categorical_backward(const float *restrict logits, const int64_t *restrict actions,
                                            const float *restrict lse, const float *restrict entropy,
                                            const float *restrict d_logp, const float *restrict d_entropy,
                                            int64_t rows, int64_t k, float *restrict d_logits) {
    for (int64_t r0 = 0; r0 < rows; r0 += CAT_BLOCK) {
        int64_t nb = cat_block_rows(r0, rows);
        float g_lp[CAT_BLOCK], g_h[CAT_BLOCK], h[CAT_BLOCK], z[CAT_BLOCK], v[CAT_BLOCK], d[CAT_BLOCK];
        for (int i = 0; i < CAT_BLOCK; i++) {
            int64_t r = r0 + (i < nb ? i : 0);
            g_lp[i] = d_logp ? d_logp[r] : 0.0f;
            g_h[i] = d_entropy ? d_entropy[r] : 0.0f;
            h[i] = entropy[r];
            z[i] = lse[r];
        }
        for (int64_t j = 0; j < k; j++) {
            cat_column(logits, r0, nb, k, j, v);
            for (int i = 0; i < CAT_BLOCK; i++) {
                float lp = v[i] - z[i];
                float p = exp_nonpos(lp);
                d[i] = p > 0.0f ? -g_lp[i] * p - g_h[i] * p * (lp + h[i]) : 0.0f;
            }
            for (int64_t i = 0; i < nb; i++) d_logits[(r0 + i) * k + j] = d[i];
        }
        for (int64_t i = 0; i < nb; i++) d_logits[(r0 + i) * k + actions[r0 + i]] += g_lp[i];
    }
}

/* PPO's loss terms over a minibatch of n rows (rlpipe.learner.scaling.weighted_ppo_terms):
   out[0] the clipped surrogate, out[1] the value loss (0.5 x the squared error, clipped if
   clip_vloss), out[2] the entropy, each the mean weighted by w (NULL: plain mean); out[3]
   approx_kl and out[4] clipfrac, unweighted. Sums in double. Returns the weight sum used. */
double ppo_terms_forward(const float *restrict nl, const float *restrict ent, const float *restrict nv,
                         const float *restrict ol, const float *restrict ov, const float *restrict adv,
                         const float *restrict ret, const float *restrict w, int64_t n, float clip, int clip_vloss,
                         double *restrict out) {
    double pg = 0, v = 0, h = 0, kl = 0, cf = 0, ws = 0;
    for (int64_t i = 0; i < n; i++) {
        float lr = nl[i] - ol[i];
        float r = expf(lr);
        float cr = r < 1.0f - clip ? 1.0f - clip : (r > 1.0f + clip ? 1.0f + clip : r);
        float u = -adv[i] * r, k = -adv[i] * cr;
        float pgi = u > k ? u : k;
        float e1 = (nv[i] - ret[i]) * (nv[i] - ret[i]), vi = e1;
        if (clip_vloss) {
            float d = nv[i] - ov[i];
            float dc = d < -clip ? -clip : (d > clip ? clip : d);
            float vc = ov[i] + dc;
            float e2 = (vc - ret[i]) * (vc - ret[i]);
            vi = e1 > e2 ? e1 : e2;
        }
        double wi = w ? (double)w[i] : 1.0;
        pg += wi * pgi;
        v += wi * vi;
        h += wi * ent[i];
        ws += wi;
        kl += (double)((r - 1.0f) - lr);
        cf += fabsf(r - 1.0f) > clip ? 1.0 : 0.0;
    }
    if (w) ws = ws > 1e-12 ? ws : 1e-12;
    out[0] = pg / ws;
    out[1] = 0.5 * v / ws;
    out[2] = h / ws;
    out[3] = n ? kl / n : NAN;
    out[4] = n ? cf / n : NAN;
    return ws;
}

/* Their gradients: d_nl, d_ent, d_nv per row from the gradients g_pg, g_v, g_h of out[0..2]
   (wsum: the forward's weight sum). A max of two equal terms passes half its gradient to
   each, and a clamp passes it at its bounds, as torch's maximum and clamp do. */
void ppo_terms_backward(const float *restrict nl, const float *restrict nv, const float *restrict ol,
                        const float *restrict ov, const float *restrict adv, const float *restrict ret,
                        const float *restrict w, int64_t n, float clip, int clip_vloss, double wsum, float g_pg,
                        float g_v, float g_h, float *restrict d_nl, float *restrict d_ent, float *restrict d_nv) {
    for (int64_t i = 0; i < n; i++) {
        float s = (float)((w ? (double)w[i] : 1.0) / wsum);
        float lr = nl[i] - ol[i];
        float r = expf(lr);
        float cr = r < 1.0f - clip ? 1.0f - clip : (r > 1.0f + clip ? 1.0f + clip : r);
        float u = -adv[i] * r, k = -adv[i] * cr;
        float through = (r >= 1.0f - clip && r <= 1.0f + clip) ? 1.0f : 0.0f;
        float gu = -adv[i] * r, gk = gu * through;
        float dpg = u > k ? gu : (k > u ? gk : 0.5f * (gu + gk));
        float g1 = 2.0f * (nv[i] - ret[i]), dv = g1;
        if (clip_vloss) {
            float d = nv[i] - ov[i];
            float dc = d < -clip ? -clip : (d > clip ? clip : d);
            float vc = ov[i] + dc;
            float e1 = (nv[i] - ret[i]) * (nv[i] - ret[i]), e2 = (vc - ret[i]) * (vc - ret[i]);
            float g2 = 2.0f * (vc - ret[i]) * ((d >= -clip && d <= clip) ? 1.0f : 0.0f);
            dv = e1 > e2 ? g1 : (e2 > e1 ? g2 : 0.5f * (g1 + g2));
        }
        d_nl[i] = g_pg * s * dpg;
        d_nv[i] = g_v * 0.5f * s * dv;
        d_ent[i] = g_h * s;
    }
}
