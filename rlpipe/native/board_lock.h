/* The lock board (buffer.sync=lock, for the ablation); layout in rlpipe/native/board.pyx.

   The same two slots and sequence word as the seqlock board (board_seqlock.h), but the copy
   in both directions happens under the env's robust process-shared mutex. The writer copies
   into the back slot and flips the sequence before unlocking, so a writer killed while
   holding the lock also leaves the previous row readable; the next locker gets EOWNERDEAD,
   marks the mutex consistent and carries on instead of blocking forever.
*/
#ifndef RLPIPE_BOARD_LOCK_H
#define RLPIPE_BOARD_LOCK_H

#include <errno.h>
#include <pthread.h>

#include "board_rows.h"

#define RL_MUTEX_OFF 8                 /* the env's mutex, in its control line after seq */

static inline pthread_mutex_t* rl_mutex(uint8_t* ctrl_base, int64_t env) {
    return (pthread_mutex_t*)(ctrl_base + env * RL_CTRL_BYTES + RL_MUTEX_OFF);
}

static int rl_lock_init(uint8_t* base, int64_t ctrl_off, int64_t n_envs) {
    pthread_mutexattr_t attr;
    int rc = 0;
    if (pthread_mutexattr_init(&attr)) return -1;
    if (pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)
            || pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)) {
        rc = -1;
    } else {
        for (int64_t e = 0; e < n_envs; e++) {
            if (pthread_mutex_init(rl_mutex(base + ctrl_off, e), &attr)) { rc = -1; break; }
        }
    }
    pthread_mutexattr_destroy(&attr);
    return rc;
}

/* Robust lock: a holder that died (SIGKILL mid-publish) hands the lock on, not a hang. */
static inline void rl_lock(pthread_mutex_t* m) {
    if (pthread_mutex_lock(m) == EOWNERDEAD) pthread_mutex_consistent(m);
}

/* Lock board: copy into the back slot and flip the sequence, all under the mutex of the
   env's lock group: lock_envs consecutive envs share the mutex of the group's first env
   (1: a mutex per env; a worker slice's size: what a hand-built design takes once per
   slice). `stream` picks the same copy routine as the seqlock's (rl_copy); the streamed
   stores are fenced before the unlock. */
static inline int64_t rl_lock_owner(int64_t env, int64_t lock_envs) {
    return lock_envs > 1 ? env - env % lock_envs : env;
}

static int64_t rl_lock_publish(uint8_t* base, int64_t ctrl_off, int nkeys,
                               const int64_t* key_off, const int64_t* stride,
                               const int64_t* row_bytes, uint8_t* const* src,
                               const int64_t* src_stride, int64_t env_lo, int64_t count,
                               const uint64_t* gen_word, uint64_t my_gen, int stream,
                               int64_t lock_envs) {
    uint8_t* ctrl_base = base + ctrl_off;
    int64_t i = 0;
    while (i < count) {
        int64_t owner = rl_lock_owner(env_lo + i, lock_envs);
        int64_t end = lock_envs > 1 ? owner + lock_envs : env_lo + i + 1;
        if (end > env_lo + count) end = env_lo + count;
        pthread_mutex_t* m = rl_mutex(ctrl_base, owner);
        rl_lock(m);
        if (__atomic_load_n(gen_word, __ATOMIC_ACQUIRE) != my_gen) {
            pthread_mutex_unlock(m);
            return -1;
        }
        for (; env_lo + i < end; i++) {
            int64_t env = env_lo + i;
            uint64_t* seq = rl_seq(ctrl_base, env);
            uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED) & ~(uint64_t)1;
            uint64_t back = ((s >> 1) + 1) & 1u;
            for (int k = 0; k < nkeys; k++)
                rl_copy(base + key_off[k] + (env * 2 + (int64_t)back) * stride[k],
                        src[k] + i * src_stride[k], (size_t)row_bytes[k], stream);
            __atomic_store_n(seq, s + 2, __ATOMIC_RELEASE);
        }
        rl_sfence(stream);
        pthread_mutex_unlock(m);
    }
    return count;
}

static int64_t rl_lock_gather(uint8_t* base, int64_t ctrl_off, int nkeys,
                              const int64_t* key_off, const int64_t* stride,
                              const int64_t* row_bytes, uint8_t* const* dst,
                              const int64_t* dst_stride, const int64_t* idx,
                              int64_t env_lo, int64_t count, int stream, int64_t lock_envs) {
    uint8_t* ctrl_base = base + ctrl_off;
    pthread_mutex_t* held = NULL;          /* kept while consecutive envs share it */
    for (int64_t i = 0; i < count; i++) {
        int64_t env = idx ? idx[i] : env_lo + i;
        pthread_mutex_t* m = rl_mutex(ctrl_base, rl_lock_owner(env, lock_envs));
        if (m != held) {
            if (held) { rl_sfence(stream); pthread_mutex_unlock(held); }
            rl_lock(m);
            held = m;
        }
        uint64_t slot = (__atomic_load_n(rl_seq(ctrl_base, env), __ATOMIC_RELAXED) >> 1) & 1u;
        for (int k = 0; k < nkeys; k++)
            rl_copy(dst[k] + i * dst_stride[k],
                    base + key_off[k] + (env * 2 + (int64_t)slot) * stride[k],
                    (size_t)row_bytes[k], stream);
    }
    rl_sfence(stream);
    if (held) pthread_mutex_unlock(held);
    return 0;
}

#endif
