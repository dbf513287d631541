/* What both obs boards share (rlpipe/native/board.pyx): the control line of an env, the row
   copy with its streamed variant and fence, acquire/release words, the index check.
   Static functions in a header: board.pyx is the one translation unit that includes it. */
#ifndef RLPIPE_BOARD_ROWS_H
#define RLPIPE_BOARD_ROWS_H

#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define RL_CTRL_BYTES 64                /* an env's control line: its sequence word at +0 */
#define RL_STREAM_MIN_ROW 4096          /* shorter rows are copied with memcpy even when streaming */

/* Copy n bytes. With `stream`, the bulk goes out in non-temporal stores: a batch bigger
   than the last-level cache then costs one write instead of a read-for-ownership plus a
   write (glibc's memcpy does the same for one big call; a gather is many row-sized calls
   below its threshold). Streamed stores are weakly ordered: callers fence (rl_sfence). */
static inline void rl_copy(uint8_t* d, const uint8_t* s, size_t n, int stream) {
#if defined(__SSE2__)
    if (stream && n >= RL_STREAM_MIN_ROW) {
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head; s += head; n -= head;
        while (n >= 64) {
            __m128i a = _mm_loadu_si128((const __m128i*)s);
            __m128i b = _mm_loadu_si128((const __m128i*)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i*)(s + 32));
            __m128i e = _mm_loadu_si128((const __m128i*)(s + 48));
            _mm_stream_si128((__m128i*)d, a);
            _mm_stream_si128((__m128i*)(d + 16), b);
            _mm_stream_si128((__m128i*)(d + 32), c);
            _mm_stream_si128((__m128i*)(d + 48), e);
            d += 64; s += 64; n -= 64;
        }
    }
#endif
    memcpy(d, s, n);
}
static inline void rl_sfence(int stream) {
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
}

/* Default streaming threshold: calls moving at least this many bytes stream. A fixed
   size (a few L2s), not sysconf's cache size: virtual machines report the host's. */
static int64_t rl_default_stream_bytes(void) { return (int64_t)8 << 20; }

static inline uint64_t* rl_seq(uint8_t* ctrl_base, int64_t env) {
    return (uint64_t*)(ctrl_base + env * RL_CTRL_BYTES);
}

/* First index i with idx[i] outside [0, n), or -1. */
static int64_t rl_bad_index(const int64_t* idx, int64_t count, int64_t n) {
    for (int64_t i = 0; i < count; i++)
        if (idx[i] < 0 || idx[i] >= n) return i;
    return -1;
}

static uint64_t rl_load_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void rl_store_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

#endif
