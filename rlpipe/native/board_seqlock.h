/* The seqlock board (buffer.sync=seqlock, the default); layout in rlpipe/native/board.pyx.

   Protocol (one writer per env, any number of readers):
   writer:  check the generation; s = seq | 1 (odd = writing); release-store s; release
            fence; write the back slot ((s >> 1) + 1) & 1; check the generation again;
            release-store s + 1 (even) -> that slot is now published.
   reader:  s1 = acquire-load seq; slot = (s1 >> 1) & 1; copy; acquire fence; s2 = load seq.
            The writer only starts overwriting `slot` at sequence (s1 & ~1) + 3, so the copy
            is whole iff s2 <= (s1 & ~1) + 2: a reader tolerates one full publish during its
            copy and retries otherwise (bounded by max_retries; retries are counted).

   Why it holds: a data byte the reader saw from a write made after the writer's release
   fence at sequence s makes the fence synchronize with the reader's acquire fence, so the
   re-check load sees at least s. The odd store is a release store too, so a reader whose
   first load sees an odd value also sees the slot published just before it (C++20 dropped
   plain stores from release sequences; on x86 both are plain moves either way).

   Big calls (stream_bytes) copy with non-temporal stores, which x86 does not order with
   other stores: the writer puts an sfence after the odd store and before the even one, and
   a gather ends with one, so the protocol above is unchanged.

   A writer killed mid-write leaves seq odd: readers keep reading the slot published before
   (it is never the one being written) and a successor's publish reuses the torn back slot.
   A writer whose generation was revoked while it was stopped inside a publish returns -1
   before its release store, so the row it was writing is never published.
*/
#ifndef RLPIPE_BOARD_SEQLOCK_H
#define RLPIPE_BOARD_SEQLOCK_H

#include "board_rows.h"

/* Publish rows [0, count) of the staged sources into envs env_lo + i.
   Returns the number published, or -1 when the owner generation moved on. */
static int64_t rl_seqlock_publish(uint8_t* base, int64_t ctrl_off, int nkeys,
                                  const int64_t* key_off, const int64_t* stride,
                                  const int64_t* row_bytes, uint8_t* const* src,
                                  const int64_t* src_stride, int64_t env_lo, int64_t count,
                                  const uint64_t* gen_word, uint64_t my_gen, int stream) {
    uint8_t* ctrl_base = base + ctrl_off;
    for (int64_t i = 0; i < count; i++) {
        if (__atomic_load_n(gen_word, __ATOMIC_ACQUIRE) != my_gen) return -1;
        int64_t env = env_lo + i;
        uint64_t* seq = rl_seq(ctrl_base, env);
        uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED) | 1u;
        __atomic_store_n(seq, s, __ATOMIC_RELEASE);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        rl_sfence(stream);                 /* the odd store before any streamed data */
        uint64_t back = ((s >> 1) + 1) & 1u;
        for (int k = 0; k < nkeys; k++) {
            rl_copy(base + key_off[k] + (env * 2 + (int64_t)back) * stride[k],
                    src[k] + i * src_stride[k], (size_t)row_bytes[k], stream);
        }
        rl_sfence(stream);                 /* all streamed data before the publishing store */
        /* Revoked while we were copying (e.g. stopped here, replaced, continued):
           leave seq odd; readers keep the previously published slot. */
        if (__atomic_load_n(gen_word, __ATOMIC_ACQUIRE) != my_gen) return -1;
        __atomic_store_n(seq, s + 1, __ATOMIC_RELEASE);
    }
    return count;
}

/* Copy the published obs of envs idx[i] (or env_lo + i when idx is NULL) into row i of
   the outputs, all keys of one env from the same publish. Returns the retries taken, or
   -1 - retries when some env stayed torn for max_retries attempts. */
static int64_t rl_seqlock_gather(uint8_t* base, int64_t ctrl_off, int nkeys,
                                 const int64_t* key_off, const int64_t* stride,
                                 const int64_t* row_bytes, uint8_t* const* dst,
                                 const int64_t* dst_stride, const int64_t* idx,
                                 int64_t env_lo, int64_t count, int64_t max_retries,
                                 int stream) {
    uint8_t* ctrl_base = base + ctrl_off;
    int64_t retries = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t env = idx ? idx[i] : env_lo + i;
        uint64_t* seq = rl_seq(ctrl_base, env);
        int64_t attempt = 0;
        for (;;) {
            uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
            uint64_t slot = (s1 >> 1) & 1u;
            for (int k = 0; k < nkeys; k++) {
                rl_copy(dst[k] + i * dst_stride[k],
                        base + key_off[k] + (env * 2 + (int64_t)slot) * stride[k],
                        (size_t)row_bytes[k], stream);
            }
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            uint64_t s2 = __atomic_load_n(seq, __ATOMIC_RELAXED);
            if (s2 <= (s1 & ~(uint64_t)1) + 2) break;
            retries++;
            if (++attempt >= max_retries) { rl_sfence(stream); return -1 - retries; }
        }
    }
    rl_sfence(stream);                     /* the output is whole when we return */
    return retries;
}

/* The original double buffer (docs/origin.md), kept for the ablation and as the stress tests' negative
   control: read the published slot with no re-check. It can return torn rows. */
static void rl_unchecked_gather(uint8_t* base, int64_t ctrl_off, int nkeys,
                                const int64_t* key_off, const int64_t* stride,
                                const int64_t* row_bytes, uint8_t* const* dst,
                                const int64_t* dst_stride, const int64_t* idx,
                                int64_t env_lo, int64_t count) {
    uint8_t* ctrl_base = base + ctrl_off;
    for (int64_t i = 0; i < count; i++) {
        int64_t env = idx ? idx[i] : env_lo + i;
        uint64_t s1 = __atomic_load_n(rl_seq(ctrl_base, env), __ATOMIC_ACQUIRE);
        uint64_t slot = (s1 >> 1) & 1u;
        for (int k = 0; k < nkeys; k++)
            memcpy(dst[k] + i * dst_stride[k],
                   base + key_off[k] + (env * 2 + (int64_t)slot) * stride[k],
                   (size_t)row_bytes[k]);
    }
}

#endif
