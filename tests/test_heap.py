"""rlpipe.heap: the driver's C heap figures read true, and its settings return freed memory."""

import ctypes

import numpy as np
import psutil
import pytest

from rlpipe import heap

pytestmark = pytest.mark.skipif(heap._LIBC is None, reason="glibc 2.33+ only")
MB = 2**20


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
