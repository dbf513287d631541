"""The doorbells between the driver and its workers: futex words in shared memory
(`rlpipe.native.bell`), no socket.

Driver -> worker ("act"): the driver writes a slice's actions, stores `seq + 1` in the
slice's act word in the worker's segment and rings the worker's bell (a line of that
segment's header). Worker -> driver ("done"): the worker publishes a slice, stores `seq + 1`
in its done word and rings the driver's bell, one page (`rlpipe_<run>_bell`) that every
worker maps. A ring is an atomic add, plus one FUTEX_WAKE when the other side sleeps; a wait
is one FUTEX_WAIT. The SEQPACKET connection per worker this replaced cost nine system calls
per round trip (the worker's poll for a frame and, its socket having a send timeout, Python's
poll before each recv and send; the driver's second recv to find a socket empty; a kernel
buffer per send); this costs about two. `benchmarks/doorbell.py` runs both in the same
loop; what it measured is in docs/benchmarks.md.

What the sockets also told, said otherwise: STOP is a word of the worker's header (with its
bell rung); a worker sees its driver gone when a wait times out (worker.doorbell_timeout_s)
and the driver's pid is gone; the driver sees a worker gone by its process (the watchdog).
A replaced generation's segment leaves the driver's scan before the new one is made, so its
late rings are read by nobody.
"""

from __future__ import annotations

import numpy as np

from rlpipe.native.bell import BELL_BYTES, STOP, RingBoard, WorkerBell, ring, wake
from rlpipe.shm.layout import H_PID, H_STOP, WorkerViews
from rlpipe.shm.segment import Segment, segment_name

BELL_PART = "bell"  # the driver's bell page: rlpipe_<run>_bell
BELL_PAGE_BYTES = 4096
STOP_SLICE = STOP  # DoorbellClient.take's slice once the driver has asked the worker to stop


class DoorbellServer:
    """The driver's end: its bell page, and the done words of every worker's current segment
    as slots (worker k's slices are slots [slot_lo, slot_lo + slices))."""

    def __init__(self, run_id: str, n_slots: int):
        self.segment = Segment.create(segment_name(run_id, BELL_PART), BELL_PAGE_BYTES)
        self.name = self.segment.name
        bell = np.frombuffer(self.segment.buf, dtype=np.uint8, count=BELL_BYTES)  # keeps the page mapped
        self.board = RingBoard(self.segment.base, n_slots, bell)

    def attach(self, worker_id: int, slot_lo: int, n_slices: int, views: WorkerViews) -> None:
        """A new generation's segment: its slices' rings are read from now on."""
        self.board.attach(worker_id, slot_lo, n_slices, views.done_addr, views.done_words)

    def detach(self, worker_id: int, slot_lo: int, n_slices: int) -> None:
        """Before a segment goes: its slices are read no more."""
        if self.board is not None:  # closed: nothing is read anyway
            self.board.detach(worker_id, slot_lo, n_slices)

    def take(self, timeout_ms: int) -> list[tuple[int, int, int]]:
        """(worker id, slice, seq) of every ring since the last call, waiting up to `timeout_ms`
        for the first."""
        return self.board.take(timeout_ms)

    def take_slots(self, timeout_ms: int, min_rings: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """`take` as two int64 arrays, (slots, seqs): a slot is its worker's slot_lo + slice;
        the wait lasts until `min_rings` have come (the earlier ones wake nobody)."""
        return self.board.take_slots(timeout_ms, min_rings)

    def close(self) -> None:
        if self.segment is None:
            return
        self.board.close()
        self.board = None
        self.segment.unlink()
        self.segment.close()
        self.segment = None


def send_act(views: WorkerViews | None, slice_index: int, seq: int) -> bool:
    """Ring a worker: the actions of step `seq` of a slice are written. False with no segment."""
    if views is None:
        return False
    ring(views.act_addr + 8 * slice_index, seq + 1, views.bell_addr)
    return True


def send_stop(views: WorkerViews | None) -> bool:
    """Ask a worker to stop; False when it cannot hear it yet (no segment, or its process has
    not attached: it has no SIGTERM handler of its own before then either)."""
    if views is None or not views.load(H_PID):
        return False
    ring(views.header_addr + H_STOP, 1, views.bell_addr)
    return True


def wake_worker(views: WorkerViews) -> None:
    """Ring a worker's bell with nothing new: it wakes and looks at its header (a revoked
    generation leaves at once rather than at its next wait's timeout)."""
    wake(views.bell_addr)


class DoorbellClient:
    """A worker's end: its act and done words and bell, and the driver's bell page."""

    def __init__(self, bell_segment: str, views: WorkerViews, n_slices: int):
        self.segment = Segment.attach(bell_segment)
        driver_bell = np.frombuffer(self.segment.buf, dtype=np.uint8, count=BELL_BYTES)
        self.bell = WorkerBell(
            views.act_addr,
            views.done_addr,
            views.header_addr + H_STOP,
            views.bell_addr,
            self.segment.base,
            n_slices,
            (views.act_words, views.done_words, driver_bell),
        )

    def take(self, timeout_ms: int) -> tuple[int, int] | None:
        """The next (slice, seq) to step, (STOP_SLICE, 0) once asked to stop, or None when
        nothing came within `timeout_ms` (0: do not wait; a signal can end a wait early)."""
        return self.bell.take(timeout_ms)

    def ring(self, slice_index: int, seq: int) -> None:
        """Tell the driver step `seq` of a slice is published."""
        self.bell.ring(slice_index, seq)

    def close(self) -> None:
        self.bell = None
        if self.segment is not None:
            self.segment.close()
            self.segment = None
