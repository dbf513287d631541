"""rlpipe.heap: the driver's C heap figures read true, and its settings return freed memory."""

import ctypes
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from rlpipe import heap

pytestmark = pytest.mark.skipif(heap._LIBC is None, reason="glibc 2.33+ only")
MB = 2**20
REPO = Path(__file__).resolve().parent.parent


def test_in_use_counts_a_live_array_and_drops_when_it_is_freed():
    before = heap.figures()["heap/in_use_mb"]
    block = np.ones(64 * MB, dtype=np.uint8)
    during = heap.figures()["heap/in_use_mb"]
    del block
    after = heap.figures()["heap/in_use_mb"]
    assert during - before > 60
    assert during - after > 60


def test_trim_returns_holes_between_live_small_blocks():
    """Many 64 KiB blocks below the mmap threshold, every other one freed: the holes stay
    resident until malloc_trim hands their pages back."""
    heap.configure(4.0, None)
    libc = heap._LIBC
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 * 1024
    blocks = [libc.malloc(size) for _ in range(4096)]  # 256 MiB
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks[::2]:
        libc.free(b)
    rss = psutil.Process().memory_info().rss
    heap.trim()
    freed = rss - psutil.Process().memory_info().rss
    for b in blocks[1::2]:
        libc.free(b)
    assert freed > 64 * MB


def test_configure_applies_on_glibc():
    assert heap.configure(None, None) is None
    assert heap.configure(4.0, 4) is None


# In a fresh interpreter: its heap has no hole that large, so each block comes from the top.
FRESH_BLOCK = """
import ctypes, resource, sys
from rlpipe import heap
if sys.argv[1] == "keep":
    heap.keep_freed_blocks()
elif sys.argv[1] != "default":
    heap.configure(4.0, None, trim_threshold_mb=float(sys.argv[1]) if sys.argv[1] != "None" else None)
libc, size = heap._LIBC, int(sys.argv[2]) * 2**20
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
first = libc.malloc(size)
ctypes.memset(first, 1, size)
libc.free(first)
faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
again = libc.malloc(size)
ctypes.memset(again, 1, size)
print(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults)
"""


def _faults_of_a_fresh_block(heap_setting: float | str | None, mb: int = 2) -> int:
    """Page faults of touching an `mb` MiB block malloc'd right after one of that size was
    freed. `heap_setting`: the trim threshold in MB beside the driver's 4 MB mmap threshold
    (None: that threshold alone), "keep" (heap.keep_freed_blocks) or "default" (glibc's own)."""
    out = subprocess.run(
        [sys.executable, "-c", FRESH_BLOCK, str(heap_setting), str(mb)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def test_the_trim_threshold_keeps_a_freed_block_for_the_next_round():
    """A 2 MiB block (an activation of a 7,000-row forward) under the 4 MiB mmap threshold: with
    glibc's 128 KiB trim threshold, which a fixed mmap threshold also fixes, its pages go back
    to the kernel when it is freed and the next block of that size faults them in anew; under
    `trim_threshold_mb` they stay for it."""
    pages = 2 * MB // resource.getpagesize()
    assert _faults_of_a_fresh_block(None) > pages // 2
    assert _faults_of_a_fresh_block(8.0) < pages // 8


def test_the_update_process_heap_keeps_its_blocks_from_update_to_update():
    """heap.keep_freed_blocks (the PPO update process's heap): a freed 16 MiB block (a large
    update's batch field) stays in the heap for the next update's, where under glibc's own
    settings the next one's pages are faulted in anew."""
    pages = 16 * MB // resource.getpagesize()
    assert _faults_of_a_fresh_block("default", 16) > pages // 2
    assert _faults_of_a_fresh_block("keep", 16) < pages // 8
