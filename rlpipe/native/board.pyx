# cython: language_level=3, boundscheck=False, wraparound=False
"""Seqlock double-buffered obs board and its lock-based twin: the Python-facing BoardView over
C kernels with __atomic builtins, one header per part. The headers hold static C functions
that this module's C file includes: one translation unit, so every call below is a direct C
call the compiler may inline, with no Python between (setup.py lists them as its depends).

  board_rows.h     what both boards share: the control line, the row copy (streamed or not)
                   and its fence, acquire/release words, the env-id check
  board_seqlock.h  the seqlock protocol (publish, checked gather) and the unchecked read of
                   the original double buffer; the protocol and why it holds are told there
  board_lock.h     the lock board (buffer.sync=lock): copies under a robust per-env mutex

Memory layout is owned by rlpipe.shm.layout; this module only sees raw addresses:

* a control line of 64 bytes per env: a uint64 sequence word at +0 (both boards) and, for
  the lock board, a process-shared robust pthread mutex at +8;
* per obs key, per env, two slots (A/B) of `stride` bytes (stride is a multiple of 64);
* a uint64 "owner generation" word in the segment header: a writer whose generation no
  longer matches has been replaced and must not publish.
"""
from libc.stdint cimport uint64_t, int64_t, uint8_t, uintptr_t

cdef extern from "board_rows.h" nogil:
    int64_t rl_default_stream_bytes()
    int64_t rl_bad_index(const int64_t* idx, int64_t count, int64_t n)
    uint64_t rl_load_u64(const uint64_t* p)
    void rl_store_u64(uint64_t* p, uint64_t v)

cdef extern from "board_seqlock.h" nogil:
    int64_t rl_seqlock_publish(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                               const int64_t* stride, const int64_t* row_bytes, uint8_t** src,
                               const int64_t* src_stride, int64_t env_lo, int64_t count,
                               const uint64_t* gen_word, uint64_t my_gen, int stream)
    int64_t rl_seqlock_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                              const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                              const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                              int64_t count, int64_t max_retries, int stream)
    void rl_unchecked_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                             const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                             const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                             int64_t count)

cdef extern from "board_lock.h" nogil:
    int rl_lock_init(uint8_t* base, int64_t ctrl_off, int64_t n_envs)
    int64_t rl_lock_publish(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                            const int64_t* stride, const int64_t* row_bytes, uint8_t** src,
                            const int64_t* src_stride, int64_t env_lo, int64_t count,
                            const uint64_t* gen_word, uint64_t my_gen, int stream,
                            int64_t lock_envs)
    int64_t rl_lock_gather(uint8_t* base, int64_t ctrl_off, int nkeys, const int64_t* key_off,
                           const int64_t* stride, const int64_t* row_bytes, uint8_t** dst,
                           const int64_t* dst_stride, const int64_t* idx, int64_t env_lo,
                           int64_t count, int stream, int64_t lock_envs)

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


def gather_slices(list boards, const int64_t[::1] board_of, const int64_t[::1] env_lo,
                  const int64_t[::1] count, ptrs, row_strides):
    """Many boards' env ranges into one batch: range i (envs env_lo[i] .. + count[i] of
    boards[board_of[i]]) fills the outputs' rows after range i - 1's (one pointer per key, as
    BoardView.gather). One call per inference round, however many slices are ready: the
    Python work of a round does not grow with them. Returns the torn-read retries it took."""
    cdef uint8_t* dst[MAX_KEYS]
    cdef uint8_t* at[MAX_KEYS]
    cdef int64_t dstride[MAX_KEYS]
    cdef int64_t retries = 0, r, row = 0
    cdef Py_ssize_t i, n = board_of.shape[0]
    cdef int k, stream
    cdef BoardView bv
    if env_lo.shape[0] != n or count.shape[0] != n:
        raise ValueError("gather_slices: board_of, env_lo and count differ in length")
    for i in range(n):
        bv = <BoardView?>boards[board_of[i]]  # checked: a slot of a worker with no board fails here
        if i == 0:
            bv._fill(ptrs, row_strides, dst, dstride)
        elif bv.nkeys != len(ptrs):
            raise ValueError("gather_slices: boards of different key sets")
        bv._check_range(env_lo[i], count[i])
        for k in range(bv.nkeys):
            at[k] = dst[k] + row * dstride[k]
        stream = bv._stream(count[i])
        with nogil:
            if bv.locked:
                r = rl_lock_gather(bv.base, bv.ctrl_off, bv.nkeys, bv.key_off, bv.stride, bv.row_bytes,
                                   at, dstride, NULL, env_lo[i], count[i], stream, bv.lock_envs)
            else:
                r = rl_seqlock_gather(bv.base, bv.ctrl_off, bv.nkeys, bv.key_off, bv.stride, bv.row_bytes,
                                      at, dstride, NULL, env_lo[i], count[i], bv.max_retries, stream)
        if r < 0:
            raise RuntimeError(f"board: an env stayed torn for {bv.max_retries} read attempts")
        retries += r
        row += count[i]
    return retries
