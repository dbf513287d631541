# cython: language_level=3, boundscheck=False, wraparound=False
"""Seqlock double-buffered obs board and its lock-based twin, in C with __atomic builtins.

This module is longer than the others (~470 lines) on purpose: both boards, their publish
and gather loops and the unchecked read of the benchmark share one set of inline C helpers
and one BoardView, and a Cython extension cannot share inline C across modules.

Memory layout is owned by rlpipe.shm.layout; this module only sees raw addresses:

* a control line of 64 bytes per env: a uint64 sequence word at +0 (both boards) and, for
  the lock board, a process-shared robust pthread mutex at +8;
* per obs key, per env, two slots (A/B) of `stride` bytes (stride is a multiple of 64);
* a uint64 "owner generation" word in the segment header: a writer whose generation no
  longer matches has been replaced and must not publish.

Seqlock protocol (one writer per env, any number of readers):
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

Lock board (buffer.sync=lock, for the ablation): the same two slots and sequence word, but
the copy in both directions happens under the env's robust process-shared mutex. The writer
copies into the back slot and flips the sequence before unlocking, so a writer killed while
holding the lock also leaves the previous row readable; the next locker gets EOWNERDEAD,
marks the mutex consistent and carries on instead of blocking forever.
"""
from libc.stdint cimport uint64_t, int64_t, uint8_t, uintptr_t

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #include <errno.h>
    #include <pthread.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif

    #define RL_CTRL_BYTES 64
    #define RL_MUTEX_OFF 8
    #define RL_STREAM_MIN_ROW 4096

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
    static inline pthread_mutex_t* rl_mutex(uint8_t* ctrl_base, int64_t env) {
        return (pthread_mutex_t*)(ctrl_base + env * RL_CTRL_BYTES + RL_MUTEX_OFF);
    }

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

    /* First index i with idx[i] outside [0, n), or -1. */
    static int64_t rl_bad_index(const int64_t* idx, int64_t count, int64_t n) {
        for (int64_t i = 0; i < count; i++)
            if (idx[i] < 0 || idx[i] >= n) return i;
        return -1;
    }

    static uint64_t rl_load_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static void rl_store_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    """
    int64_t rl_seqlock_publish(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                               const int64_t* stride, const int64_t* row_bytes, uint8_t** src,
                               const int64_t* src_stride, int64_t env_lo, int64_t count,
                               const uint64_t* gen_word, uint64_t my_gen, int stream) nogil
    int64_t rl_seqlock_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                              const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                              const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                              int64_t count, int64_t max_retries, int stream) nogil
    int64_t rl_default_stream_bytes() nogil
    void rl_unchecked_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                             const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                             const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                             int64_t count) nogil
    int rl_lock_init(uint8_t* base, int64_t ctrl_off, int64_t n_envs) nogil
    int64_t rl_lock_publish(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                            const int64_t* stride, const int64_t* row_bytes, uint8_t** src,
                            const int64_t* src_stride, int64_t env_lo, int64_t count,
                            const uint64_t* gen_word, uint64_t my_gen, int stream,
                            int64_t lock_envs) nogil
    int64_t rl_lock_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                           const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                           const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                           int64_t count, int stream, int64_t lock_envs) nogil
    int64_t rl_bad_index(const int64_t* idx, int64_t count, int64_t n) nogil
    uint64_t rl_load_u64(const uint64_t* p) nogil
    void rl_store_u64(uint64_t* p, uint64_t v) nogil

DEF MAX_KEYS = 8

DEF CTRL_BYTES = 64


cdef class BoardView:
    """Native handle on one board: the segment base address and its per-key geometry.

    Built once per (segment, key set); the hot calls then only take row pointers. With
    n_envs >= 0 every env id a call touches is bounds-checked (an IndexError, not a wild
    read); n_envs=-1 (the default) trusts the caller. `keepalive` (the segment's mmap) is
    pinned with a buffer export for the view's lifetime, so the mapping cannot be unmapped
    under the raw pointers (mmap.close() raises BufferError instead of leaving them dangling).
    A call that moves at least `stream_bytes` bytes (seqlock default 8 MiB, past what the
    caches keep anyway; lock board default -1) writes rows of 4 KiB and up with non-temporal
    stores; -1 never streams. Lock board only: `lock_envs` consecutive envs share one mutex
    (default 1, a mutex per env; benchmarks/board.py sets a slice's size).
    """
    cdef uint8_t* base
    cdef int64_t ctrl_off
    cdef readonly int nkeys
    cdef int64_t key_off[MAX_KEYS]
    cdef int64_t stride[MAX_KEYS]
    cdef int64_t row_bytes[MAX_KEYS]
    cdef uint64_t* gen_word
    cdef public bint locked
    cdef public int64_t max_retries
    cdef public int64_t n_envs
    cdef public int64_t stream_bytes
    cdef public int64_t lock_envs
    cdef int64_t row_total
    cdef object _pin

    def __init__(self, uintptr_t base, int64_t ctrl_off, key_offsets, strides, row_bytes,
                 uintptr_t gen_word, bint locked=False, int64_t max_retries=100000,
                 int64_t n_envs=-1, keepalive=None):
        if not (len(key_offsets) == len(strides) == len(row_bytes)) or len(key_offsets) > MAX_KEYS:
            raise ValueError("board geometry: key_offsets, strides and row_bytes must have the "
                             f"same length (at most {MAX_KEYS})")
        if (base + ctrl_off) % 64:
            raise ValueError("board geometry: the control lines must be 64-byte aligned")
        if max_retries < 1:
            raise ValueError("board: max_retries must be at least 1")
        self.base = <uint8_t*>base
        self.ctrl_off = ctrl_off
        self.nkeys = len(key_offsets)
        self.row_total = 0
        for k in range(self.nkeys):
            if strides[k] % 64 or (base + key_offsets[k]) % 64 or row_bytes[k] > strides[k]:
                raise ValueError("board geometry: slots must be 64-byte aligned and hold a row")
            self.key_off[k] = key_offsets[k]
            self.stride[k] = strides[k]
            self.row_bytes[k] = row_bytes[k]
            self.row_total += row_bytes[k]
        self.gen_word = <uint64_t*>gen_word
        self.locked = locked
        self.max_retries = max_retries
        self.n_envs = n_envs
        self.stream_bytes = -1 if locked else rl_default_stream_bytes()
        self.lock_envs = 1
        self._pin = None
        if keepalive is not None:
            try:
                self._pin = memoryview(keepalive)
            except TypeError:
                self._pin = keepalive

    def init_locks(self, int64_t n_envs):
        if rl_lock_init(self.base, self.ctrl_off, n_envs) != 0:
            raise OSError("pthread_mutex_init failed for the lock board")

    def slot_address(self, int k, int64_t env, int slot):
        """Address of slot A (0) or B (1) of key k for env (tests check the alignment)."""
        if not 0 <= k < self.nkeys or slot not in (0, 1):
            raise IndexError("board: no such key or slot")
        self._check_range(env, 1)
        return <uintptr_t>(self.base + self.key_off[k] + (env * 2 + slot) * self.stride[k])

    def seq(self, int64_t env):
        """Acquire-load of env's sequence word (odd: a publish is in flight or was cut off)."""
        self._check_range(env, 1)
        return rl_load_u64(<const uint64_t*>(self.base + self.ctrl_off + env * CTRL_BYTES))

    def publish(self, ptrs, row_strides, int64_t env_lo, int64_t count, uint64_t my_gen):
        """Publish `count` staged rows (one pointer per key) into envs env_lo.. .
        Returns count, or -1 if this writer's generation was revoked."""
        cdef uint8_t* src[MAX_KEYS]
        cdef int64_t sstride[MAX_KEYS]
        cdef int64_t n
        cdef int stream = self._stream(count)
        self._fill(ptrs, row_strides, src, sstride)
        self._check_range(env_lo, count)
        with nogil:
            if self.locked:
                n = rl_lock_publish(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                    self.row_bytes, src, sstride, env_lo, count, self.gen_word, my_gen,
                                    stream, self.lock_envs)
            else:
                n = rl_seqlock_publish(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                       self.row_bytes, src, sstride, env_lo, count, self.gen_word, my_gen,
                                       stream)
        return n

    def gather(self, ptrs, row_strides, int64_t env_lo, int64_t count, idx=0):
        """Copy the current obs of envs (idx[i] if idx else env_lo + i) into row i of the
        outputs (one pointer per key: a numpy array's or a torch tensor's memory), without
        the GIL. `idx` is a contiguous int64 array of env ids (numpy, torch via .numpy(),
        anything with the buffer protocol) or the address of one (0: none). Returns the
        torn-read retries it took; raises if an env stays torn for max_retries attempts."""
        cdef uint8_t* dst[MAX_KEYS]
        cdef int64_t dstride[MAX_KEYS]
        cdef int64_t r
        cdef const int64_t* ids = self._ids(idx, env_lo, count)
        cdef int stream = self._stream(count)
        self._fill(ptrs, row_strides, dst, dstride)
        with nogil:
            if self.locked:
                r = rl_lock_gather(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                   self.row_bytes, dst, dstride, ids, env_lo, count, stream,
                                   self.lock_envs)
            else:
                r = rl_seqlock_gather(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                      self.row_bytes, dst, dstride, ids, env_lo, count,
                                      self.max_retries, stream)
        if r < 0:
            raise RuntimeError(f"board: an env stayed torn for {self.max_retries} read attempts")
        return r

    def gather_unchecked(self, ptrs, row_strides, int64_t env_lo, int64_t count, idx=0):
        """The original double-buffer read (published slot, no re-check): for the ablation
        and as the negative control of the torn-read tests. May return torn rows."""
        cdef uint8_t* dst[MAX_KEYS]
        cdef int64_t dstride[MAX_KEYS]
        cdef const int64_t* ids = self._ids(idx, env_lo, count)
        self._fill(ptrs, row_strides, dst, dstride)
        with nogil:
            rl_unchecked_gather(self.base, self.ctrl_off, self.nkeys, self.key_off, self.stride,
                                self.row_bytes, dst, dstride, ids, env_lo, count)
        return 0

    cdef const int64_t* _ids(self, idx, int64_t env_lo, int64_t count) except? NULL:
        cdef const int64_t[::1] view
        cdef const int64_t* ids
        cdef int64_t bad
        if count < 0:
            raise ValueError("board: negative count")
        if isinstance(idx, int):
            if idx == 0:
                self._check_range(env_lo, count)
                return NULL
            ids = <const int64_t*><uintptr_t>idx       # a raw address: the caller vouches for it
        else:
            view = idx
            if view.shape[0] < count:
                raise ValueError(f"board: {count} rows asked but only {view.shape[0]} env ids given")
            ids = &view[0] if count else NULL
            # The memoryview is released on return; `idx` itself keeps the memory alive for the
            # duration of the call, since the caller holds it.
        if self.n_envs >= 0 and count:
            with nogil:
                bad = rl_bad_index(ids, count, self.n_envs)
            if bad >= 0:
                raise IndexError(f"board: env id {ids[bad]} (row {bad}) outside [0, {self.n_envs})")
        return ids

    cdef inline int _stream(self, int64_t count):
        return self.stream_bytes >= 0 and count * self.row_total >= self.stream_bytes

    cdef int _check_range(self, int64_t env_lo, int64_t count) except -1:
        if count < 0:
            raise ValueError("board: negative count")
        if env_lo < 0 or (self.n_envs >= 0 and env_lo + count > self.n_envs):
            raise IndexError(f"board: envs [{env_lo}, {env_lo + count}) outside [0, {self.n_envs})")
        return 0

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
