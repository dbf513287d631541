# cython: language_level=3, boundscheck=False, wraparound=False
"""The doorbells between the driver and its workers: futex words in shared memory.

A bell is three uint32 words on a cache line of their own: `rings`, a counter every ring adds
one to (the futex word); `sleeping`, set by the one thread that waits on it while it sleeps;
and `wake_at`, the value of `rings` that waiter waits for. Ringing is an atomic add plus, only
if the waiter sleeps and `rings` has reached `wake_at`, one FUTEX_WAKE; waiting is a
FUTEX_WAIT, and none when the rings are already there. No fd, no kernel buffer per ring.

    waiter:  seen = rings; wake_at = seen + need; sleeping = 1; look for work;
             while too little: cur = rings; if cur reached wake_at: done; FUTEX_WAIT(rings, cur)
    ringer:  publish the work; r = (rings += 1); if sleeping and r reached wake_at: FUTEX_WAKE

Every access is sequentially consistent, so either the waiter's load of `rings` sees the
ring, or the ringer sees `sleeping` and `wake_at` (and its add has moved `rings` past `cur`,
so a wait not yet begun returns at once): a ring the waiter waits for is never slept through.
A worker waits for one ring (need 1). The driver, gathering ready slices, may wait for more
(`RingBoard.take_slots`' `min_rings`): the rings before then wake nobody, where each used to
wake it for a look that served nothing (docs/benchmarks.md, "The driver woken per ring").

What a ring carries is one uint64 word per slice in the worker's segment (rlpipe.shm.layout),
`seq + 1` of the step it is about (0: none yet):

* `act[s]`, written by the driver: the actions of step `seq` of slice s are in the action
  arrays. The worker's own bell (in its segment's header) is rung after it.
* `done[s]`, written by the worker: step `seq` of slice s is published on the board. The
  driver's bell (its page `rlpipe_<run>_bell`, shared by every worker) is rung after it.

There is one request in flight per slice (the driver answers a ring, the worker rings the
next step only once it has stepped), so a word never has to hold two: a new value is a new
ring. The driver scans the done words of every worker's current segment (`RingBoard`), so a
replaced generation's late ring lands in a segment nobody reads. A worker's STOP is a header
word it looks at before its act words.

A wait also ends at its timeout, or at a signal (whose Python handler runs before the wait
returns: a worker's OS beat, a driver's SIGTERM), so a caller looks around (is its driver
alive, its generation current) at least that often.
"""
import numpy as np

from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free

cdef extern from *:
    """
    #include <stdint.h>
    #include <errno.h>
    #include <limits.h>
    #include <time.h>
    #include <unistd.h>
    #include <sys/syscall.h>
    #include <linux/futex.h>

    static inline uint64_t rl_bell_load64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void rl_bell_store64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

    /* `rings` has reached `wake_at`: counted modulo 2^32, within half the range of it */
    static inline int rl_bell_reached(uint32_t rings, uint32_t wake_at) { return (int32_t)(rings - wake_at) >= 0; }

    static inline void rl_bell_ring(uint32_t* bell) {
        uint32_t r = __atomic_add_fetch(bell, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(bell + 1, __ATOMIC_SEQ_CST) && rl_bell_reached(r, __atomic_load_n(bell + 2, __ATOMIC_SEQ_CST)))
            syscall(SYS_futex, bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }

    static inline uint32_t rl_bell_rings(const uint32_t* bell) { return __atomic_load_n(bell, __ATOMIC_SEQ_CST); }

    /* Before the last look for work: the value of `rings` to wake at, with `sleeping` raised
       after it. */
    static inline void rl_bell_arm(uint32_t* bell, uint32_t wake_at) {
        __atomic_store_n(bell + 2, wake_at, __ATOMIC_SEQ_CST);
        __atomic_store_n(bell + 1, 1, __ATOMIC_SEQ_CST);
    }

    static inline void rl_bell_disarm(uint32_t* bell) { __atomic_store_n(bell + 1, 0, __ATOMIC_SEQ_CST); }

    static inline long rl_ns_left(const struct timespec* deadline) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        return (deadline->tv_sec - now.tv_sec) * 1000000000L + (deadline->tv_nsec - now.tv_nsec);
    }

    /* Sleep until `rings` reaches `wake_at` or `timeout_ms` passes (< 0: no limit); 1 if a
       signal cut it. A ring short of `wake_at` that lands before the FUTEX_WAIT makes it
       return at once: the loop looks again and waits on the new value. */
    static inline int rl_bell_sleep(uint32_t* bell, uint32_t wake_at, int timeout_ms) {
        struct timespec deadline, left;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec += 1; deadline.tv_nsec -= 1000000000L; }
        for (;;) {
            uint32_t cur = __atomic_load_n(bell, __ATOMIC_SEQ_CST);
            if (rl_bell_reached(cur, wake_at))
                return 0;
            long ns = timeout_ms >= 0 ? rl_ns_left(&deadline) : 1;
            if (ns <= 0)
                return 0;
            left.tv_sec = ns / 1000000000L;
            left.tv_nsec = ns % 1000000000L;
            long r = syscall(SYS_futex, bell, FUTEX_WAIT, cur, timeout_ms >= 0 ? &left : NULL, NULL, 0);
            if (r == -1 && errno == EINTR)
                return 1;
            if (r == -1 && errno == ETIMEDOUT)
                return 0;
        }
    }
    """
    uint64_t rl_bell_load64(const uint64_t* p) nogil
    void rl_bell_store64(uint64_t* p, uint64_t v) nogil
    void rl_bell_ring(uint32_t* bell) nogil
    uint32_t rl_bell_rings(const uint32_t* bell) nogil
    void rl_bell_arm(uint32_t* bell, uint32_t wake_at) nogil
    void rl_bell_disarm(uint32_t* bell) nogil
    int rl_bell_sleep(uint32_t* bell, uint32_t wake_at, int timeout_ms) nogil

cdef enum:
    SCAN_STOP = -1

BELL_BYTES = 64  # a bell's cache line: rings, sleeping, wake_at (u32 each), the rest unused
STOP = SCAN_STOP  # WorkerBell.take's slice once the driver has asked the worker to stop


cdef inline int _sleep(uint32_t* bell, uint32_t wake_at, int timeout_ms) except -1:
    cdef int cut
    with nogil:
        cut = rl_bell_sleep(bell, wake_at, timeout_ms)
    if cut:
        PyErr_CheckSignals()  # the handler runs now (a worker's OS beat, a driver's SIGTERM)
    return 0


def ring(uintptr_t word, uint64_t value, uintptr_t bell):
    """Store `value` into the uint64 at `word`, then ring the bell at `bell`."""
    rl_bell_store64(<uint64_t*>word, value)
    rl_bell_ring(<uint32_t*>bell)


def ring_words(const uint64_t[::1] words, const uint64_t[::1] values, const uint64_t[::1] bells):
    """Store values[i] into the uint64 at words[i] for every i, then ring each bell of `bells`
    (each once: a worker whose several slices are answered in one round wakes once)."""
    cdef Py_ssize_t i, n = words.shape[0]
    if values.shape[0] != n:
        raise ValueError("ring_words: words and values differ in length")
    with nogil:
        for i in range(n):
            rl_bell_store64(<uint64_t*>words[i], values[i])
        for i in range(bells.shape[0]):
            rl_bell_ring(<uint32_t*>bells[i])


def wake(uintptr_t bell):
    """Ring the bell at `bell` with nothing new: its waiter wakes and looks around."""
    rl_bell_ring(<uint32_t*>bell)


cdef class WorkerBell:
    """A worker's end: its act words and bell, its done words, its stop word, the driver's
    bell. `keepalive` holds the mappings the addresses point into."""
    cdef uint64_t* act
    cdef uint64_t* done
    cdef uint64_t* stop
    cdef uint32_t* bell
    cdef uint32_t* driver_bell
    cdef uint64_t* served  # per slice: the last act value taken
    cdef int n_slices
    cdef int next_slice  # where the next scan starts: slices are served in turn
    cdef object keepalive

    def __cinit__(self, uintptr_t act, uintptr_t done, uintptr_t stop, uintptr_t bell,
                  uintptr_t driver_bell, int n_slices, keepalive):
        self.served = <uint64_t*>calloc(max(n_slices, 1), sizeof(uint64_t))
        if self.served == NULL:
            raise MemoryError()
        self.act, self.done, self.stop = <uint64_t*>act, <uint64_t*>done, <uint64_t*>stop
        self.bell, self.driver_bell = <uint32_t*>bell, <uint32_t*>driver_bell
        self.n_slices, self.next_slice, self.keepalive = n_slices, 0, keepalive

    def __dealloc__(self):
        free(self.served)

    cdef int _scan(self) noexcept:
        """The next slice with an act not yet taken (taking it), STOP, or n_slices: none."""
        cdef int k, s
        cdef uint64_t v
        if rl_bell_load64(self.stop):
            return SCAN_STOP
        for k in range(self.n_slices):
            s = (self.next_slice + k) % self.n_slices
            v = rl_bell_load64(self.act + s)
            if v != self.served[s]:
                self.served[s] = v
                self.next_slice = s + 1
                return s
        return self.n_slices

    def take(self, int timeout_ms):
        """(slice, seq) of the next act, (STOP, 0) once asked to stop, or None when nothing
        came within `timeout_ms` (0: do not wait; a signal may end a wait early)."""
        cdef int s = self._scan()
        cdef uint32_t wake_at
        if s == self.n_slices and timeout_ms != 0:
            wake_at = rl_bell_rings(self.bell) + 1  # the rescan below sees every earlier one
            rl_bell_arm(self.bell, wake_at)
            try:
                s = self._scan()
                if s == self.n_slices:
                    _sleep(self.bell, wake_at, timeout_ms)
                    s = self._scan()
            finally:  # a signal handler's exception too: the driver stops waking us for nothing
                rl_bell_disarm(self.bell)
        if s == SCAN_STOP:
            return (STOP, 0)
        if s == self.n_slices:
            return None
        return (s, self.served[s] - 1)

    def ring(self, int s, uint64_t seq):
        """Tell the driver step `seq` of slice s is published."""
        rl_bell_store64(self.done + s, seq + 1)
        rl_bell_ring(self.driver_bell)


cdef class RingBoard:
    """The driver's end: its bell and every worker's current done words, as slots (a
    worker's slices are slots [lo, lo + n)). `take` returns the rings since the last call."""
    cdef uint32_t* bell
    cdef uint64_t** done  # per slot: its done word, NULL while no segment is attached
    cdef uint64_t* seen  # per slot: the last done value taken
    cdef int64_t* owner  # per slot: the worker id
    cdef int64_t* slice_of  # per slot: the slice index inside its worker
    cdef int n_slots
    cdef object bell_keepalive
    cdef dict keepalive  # worker id -> the mapping its slots point into

    def __cinit__(self, uintptr_t bell, int n_slots, bell_keepalive):
        n = max(n_slots, 1)
        self.done = <uint64_t**>calloc(n, sizeof(uint64_t*))
        self.seen = <uint64_t*>calloc(n, sizeof(uint64_t))
        self.owner = <int64_t*>calloc(n, sizeof(int64_t))
        self.slice_of = <int64_t*>calloc(n, sizeof(int64_t))
        if self.done == NULL or self.seen == NULL or self.owner == NULL or self.slice_of == NULL:
            raise MemoryError()
        self.bell, self.n_slots = <uint32_t*>bell, n_slots
        self.bell_keepalive, self.keepalive = bell_keepalive, {}

    def __dealloc__(self):
        free(self.done)
        free(self.seen)
        free(self.owner)
        free(self.slice_of)

    def attach(self, int64_t worker_id, int lo, int n, uintptr_t done, keepalive):
        """Worker `worker_id`'s new segment: slots [lo, lo + n) read its n done words from
        `done` on (none taken yet)."""
        if lo < 0 or n < 0 or lo + n > self.n_slots:
            raise ValueError(f"slots [{lo}, {lo + n}) outside [0, {self.n_slots})")
        cdef int k
        for k in range(n):
            self.done[lo + k] = (<uint64_t*>done) + k
            self.seen[lo + k] = 0
            self.owner[lo + k] = worker_id
            self.slice_of[lo + k] = k
        self.keepalive[worker_id] = keepalive

    def detach(self, int64_t worker_id, int lo, int n):
        """Slots [lo, lo + n) read nothing until the next attach (their segment is going)."""
        cdef int k
        for k in range(max(0, lo), min(lo + n, self.n_slots)):
            self.done[k] = NULL
        self.keepalive.pop(worker_id, None)

    cdef Py_ssize_t _scan_into(self, int64_t* slots, int64_t* seqs, Py_ssize_t m) noexcept:
        """The rings since the last scan, written after the first `m` taken; the new total."""
        cdef int k
        cdef uint64_t v
        for k in range(self.n_slots):
            if self.done[k] != NULL:
                v = rl_bell_load64(self.done[k])
                if v != self.seen[k]:
                    self.seen[k] = v
                    slots[m] = k
                    seqs[m] = <int64_t>v - 1
                    m += 1
        return m

    def take_slots(self, int timeout_ms, int min_rings=1):
        """`take` by slot, as two int64 arrays (slots, seqs): the rings since the last call,
        waiting up to `timeout_ms` until there are `min_rings` of them (those found at once
        count). A slot is its worker's slot_lo + slice.

        The wait ends no later than the `min_rings`-th ring, maybe sooner. `seen` is read
        before the first scan, so every ring that scan missed moves `rings` after it; a ring
        it took may count there too (its done word is stored before its add), which only
        wakes the caller early."""
        slots = np.empty(max(self.n_slots, 1), dtype=np.int64)
        seqs = np.empty(max(self.n_slots, 1), dtype=np.int64)
        cdef int64_t[::1] sl = slots
        cdef int64_t[::1] sq = seqs
        cdef uint32_t seen = rl_bell_rings(self.bell)
        cdef Py_ssize_t m = self._scan_into(&sl[0], &sq[0], 0)
        cdef uint32_t wake_at
        if m < min_rings and timeout_ms != 0:
            wake_at = seen + <uint32_t>(min_rings - m)  # the rescan's rings are counted in it
            rl_bell_arm(self.bell, wake_at)
            try:
                m = self._scan_into(&sl[0], &sq[0], m)
                if m < min_rings:
                    _sleep(self.bell, wake_at, timeout_ms)
                    m = self._scan_into(&sl[0], &sq[0], m)
            finally:
                rl_bell_disarm(self.bell)
        return slots[:m], seqs[:m]

    def take(self, int timeout_ms):
        """[(worker id, slice, seq)] rung since the last call, waiting up to `timeout_ms` for
        the first (0: do not wait; a signal may end a wait early)."""
        slots, seqs = self.take_slots(timeout_ms)
        return [(self.owner[k], self.slice_of[k], q) for k, q in zip(slots.tolist(), seqs.tolist())]

    def close(self):
        cdef int k
        for k in range(self.n_slots):
            self.done[k] = NULL
        self.keepalive.clear()
        self.bell_keepalive = None
