# cython: language_level=3, boundscheck=False, wraparound=False
"""Seqlock double-buffered obs board and its lock-based twin, in C with __atomic builtins.

Memory layout is owned by rlpipe.shm.layout; this module only sees raw addresses:

* a control line of 64 bytes per env: a uint64 sequence word at +0 (seqlock board) or a
  process-shared pthread mutex at +8 (lock board);
* per obs key, per env, two slots (A/B) of `stride` bytes (stride is a multiple of 64);
* a uint64 "owner generation" word in the segment header: a writer whose generation no
  longer matches has been replaced and must not publish.

Seqlock protocol (one writer per env, any number of readers):
  writer:  s = seq | 1 (odd = writing); store s; release fence; write back slot
           ((s >> 1) + 1) & 1; release-store s + 1 (even) -> that slot is now published.
  reader:  s1 = acquire-load seq; slot = (s1 >> 1) & 1; copy; acquire fence; s2 = load seq.
           The writer only starts overwriting `slot` at sequence (s1 & ~1) + 3, so the copy
           is whole iff s2 <= (s1 & ~1) + 2: a reader tolerates one full publish during its
           copy and retries otherwise.
"""
from libc.stdint cimport uint64_t, int64_t, uint8_t, uintptr_t

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #include <pthread.h>

    #define RL_CTRL_BYTES 64
    #define RL_MUTEX_OFF 8

    static inline uint64_t* rl_seq(uint8_t* ctrl_base, int64_t env) {
        return (uint64_t*)(ctrl_base + env * RL_CTRL_BYTES);
    }
    static inline pthread_mutex_t* rl_mutex(uint8_t* ctrl_base, int64_t env) {
        return (pthread_mutex_t*)(ctrl_base + env * RL_CTRL_BYTES + RL_MUTEX_OFF);
    }

    /* Publish rows [0, count) of the staged sources into envs env_lo + i.
       Returns the number published, or -1 when the owner generation moved on. */
    static int64_t rl_seqlock_publish(uint8_t* base, int64_t ctrl_off, int nkeys,
                                      const int64_t* key_off, const int64_t* stride,
                                      const int64_t* row_bytes, uint8_t* const* src,
                                      const int64_t* src_stride, int64_t env_lo, int64_t count,
                                      const uint64_t* gen_word, uint64_t my_gen) {
        uint8_t* ctrl_base = base + ctrl_off;
        for (int64_t i = 0; i < count; i++) {
            if (__atomic_load_n(gen_word, __ATOMIC_ACQUIRE) != my_gen) return -1;
            int64_t env = env_lo + i;
            uint64_t* seq = rl_seq(ctrl_base, env);
            uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED) | 1u;
            __atomic_store_n(seq, s, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_RELEASE);
            uint64_t back = ((s >> 1) + 1) & 1u;
            for (int k = 0; k < nkeys; k++) {
                memcpy(base + key_off[k] + (env * 2 + (int64_t)back) * stride[k],
                       src[k] + i * src_stride[k], (size_t)row_bytes[k]);
            }
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
                                     int64_t env_lo, int64_t count, int64_t max_retries) {
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
                    memcpy(dst[k] + i * dst_stride[k],
                           base + key_off[k] + (env * 2 + (int64_t)slot) * stride[k],
                           (size_t)row_bytes[k]);
                }
                __atomic_thread_fence(__ATOMIC_ACQUIRE);
                uint64_t s2 = __atomic_load_n(seq, __ATOMIC_RELAXED);
                if (s2 <= (s1 & ~(uint64_t)1) + 2) break;
                retries++;
                if (++attempt >= max_retries) return -1 - retries;
            }
        }
        return retries;
    }

    static int rl_lock_init(uint8_t* base, int64_t ctrl_off, int64_t n_envs) {
        pthread_mutexattr_t attr;
        if (pthread_mutexattr_init(&attr)) return -1;
        if (pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)) return -1;
        for (int64_t e = 0; e < n_envs; e++) {
            if (pthread_mutex_init(rl_mutex(base + ctrl_off, e), &attr)) return -1;
        }
        pthread_mutexattr_destroy(&attr);
        return 0;
    }

    /* Lock board: one slot per env (slot A), guarded by the env's process-shared mutex. */
    static int64_t rl_lock_publish(uint8_t* base, int64_t ctrl_off, int nkeys,
                                   const int64_t* key_off, const int64_t* stride,
                                   const int64_t* row_bytes, uint8_t* const* src,
                                   const int64_t* src_stride, int64_t env_lo, int64_t count,
                                   const uint64_t* gen_word, uint64_t my_gen) {
        for (int64_t i = 0; i < count; i++) {
            if (__atomic_load_n(gen_word, __ATOMIC_ACQUIRE) != my_gen) return -1;
            int64_t env = env_lo + i;
            pthread_mutex_t* m = rl_mutex(base + ctrl_off, env);
            pthread_mutex_lock(m);
            for (int k = 0; k < nkeys; k++)
                memcpy(base + key_off[k] + env * 2 * stride[k], src[k] + i * src_stride[k],
                       (size_t)row_bytes[k]);
            pthread_mutex_unlock(m);
        }
        return count;
    }

    static int64_t rl_lock_gather(uint8_t* base, int64_t ctrl_off, int nkeys,
                                  const int64_t* key_off, const int64_t* stride,
                                  const int64_t* row_bytes, uint8_t* const* dst,
                                  const int64_t* dst_stride, const int64_t* idx,
                                  int64_t env_lo, int64_t count) {
        for (int64_t i = 0; i < count; i++) {
            int64_t env = idx ? idx[i] : env_lo + i;
            pthread_mutex_t* m = rl_mutex(base + ctrl_off, env);
            pthread_mutex_lock(m);
            for (int k = 0; k < nkeys; k++)
                memcpy(dst[k] + i * dst_stride[k], base + key_off[k] + env * 2 * stride[k],
                       (size_t)row_bytes[k]);
            pthread_mutex_unlock(m);
        }
        return 0;
    }

    static uint64_t rl_load_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static void rl_store_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    """
    int64_t rl_seqlock_publish(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                               const int64_t* stride, const int64_t* row_bytes, uint8_t** src,
                               const int64_t* src_stride, int64_t env_lo, int64_t count,
                               const uint64_t* gen_word, uint64_t my_gen) nogil
    int64_t rl_seqlock_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                              const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                              const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                              int64_t count, int64_t max_retries) nogil
    int rl_lock_init(uint8_t* base, int64_t ctrl_off, int64_t n_envs) nogil
    int64_t rl_lock_publish(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                            const int64_t* stride, const int64_t* row_bytes, uint8_t** src,
                            const int64_t* src_stride, int64_t env_lo, int64_t count,
                            const uint64_t* gen_word, uint64_t my_gen) nogil
    int64_t rl_lock_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                           const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                           const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                           int64_t count) nogil
    uint64_t rl_load_u64(const uint64_t* p) nogil
    void rl_store_u64(uint64_t* p, uint64_t v) nogil

DEF MAX_KEYS = 8


cdef class BoardView:
    """Native handle on one board: the segment base address and its per-key geometry.

    Built once per (segment, key set); the hot calls then only take row pointers.
    """
    cdef uint8_t* base
    cdef int64_t ctrl_off
    cdef int nkeys
    cdef int64_t key_off[MAX_KEYS]
    cdef int64_t stride[MAX_KEYS]
    cdef int64_t row_bytes[MAX_KEYS]
    cdef uint64_t* gen_word
    cdef public bint locked
    cdef public int64_t max_retries

    def __init__(self, uintptr_t base, int64_t ctrl_off, key_offsets, strides, row_bytes,
                 uintptr_t gen_word, bint locked=False, int64_t max_retries=100000):
        if not (len(key_offsets) == len(strides) == len(row_bytes)) or len(key_offsets) > MAX_KEYS:
            raise ValueError("board geometry: key_offsets, strides and row_bytes must have the "
                             f"same length (at most {MAX_KEYS})")
        self.base = <uint8_t*>base
        self.ctrl_off = ctrl_off
        self.nkeys = len(key_offsets)
        for k in range(self.nkeys):
            if strides[k] % 64 or key_offsets[k] % 64 or row_bytes[k] > strides[k]:
                raise ValueError("board geometry: slots must be 64-byte aligned and hold a row")
            self.key_off[k] = key_offsets[k]
            self.stride[k] = strides[k]
            self.row_bytes[k] = row_bytes[k]
        self.gen_word = <uint64_t*>gen_word
        self.locked = locked
        self.max_retries = max_retries

    def init_locks(self, int64_t n_envs):
        if rl_lock_init(self.base, self.ctrl_off, n_envs) != 0:
            raise OSError("pthread_mutex_init failed for the lock board")

    def publish(self, ptrs, row_strides, int64_t env_lo, int64_t count, uint64_t my_gen):
        """Publish `count` staged rows (one pointer per key) into envs env_lo.. .
        Returns count, or -1 if this writer's generation was revoked."""
        cdef uint8_t* src[MAX_KEYS]
        cdef int64_t sstride[MAX_KEYS]
        cdef int64_t n
        self._fill(ptrs, row_strides, src, sstride)
        with nogil:
            if self.locked:
                n = rl_lock_publish(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                    self.row_bytes, src, sstride, env_lo, count, self.gen_word, my_gen)
            else:
                n = rl_seqlock_publish(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                       self.row_bytes, src, sstride, env_lo, count, self.gen_word, my_gen)
        return n

    def gather(self, ptrs, row_strides, int64_t env_lo, int64_t count, uintptr_t idx=0):
        """Copy the current obs of envs (idx[i] if idx else env_lo + i) into row i of the
        outputs. Returns the torn-read retries it took; raises if an env stays torn."""
        cdef uint8_t* dst[MAX_KEYS]
        cdef int64_t dstride[MAX_KEYS]
        cdef int64_t r
        self._fill(ptrs, row_strides, dst, dstride)
        with nogil:
            if self.locked:
                r = rl_lock_gather(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                   self.row_bytes, dst, dstride, <const int64_t*>idx, env_lo, count)
            else:
                r = rl_seqlock_gather(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                      self.row_bytes, dst, dstride, <const int64_t*>idx, env_lo, count,
                                      self.max_retries)
        if r < 0:
            raise RuntimeError(f"board: an env stayed torn for {self.max_retries} read attempts")
        return r

    cdef _fill(self, ptrs, row_strides, uint8_t** out, int64_t* out_stride):
        if len(ptrs) != self.nkeys or len(row_strides) != self.nkeys:
            raise ValueError(f"board: expected {self.nkeys} row pointers")
        for k in range(self.nkeys):
            out[k] = <uint8_t*><uintptr_t>ptrs[k]
            out_stride[k] = row_strides[k]
            if out_stride[k] < self.row_bytes[k]:
                raise ValueError("board: row stride smaller than the row")


def load_u64(uintptr_t addr):
    """Acquire-load of a uint64 word in shared memory (generation, heartbeat stamps)."""
    return rl_load_u64(<const uint64_t*>addr)


def store_u64(uintptr_t addr, uint64_t value):
    """Release-store of a uint64 word in shared memory."""
    rl_store_u64(<uint64_t*>addr, value)
