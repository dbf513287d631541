# cython: language_level=3, boundscheck=False, wraparound=False
"""Byte spans copied between shared memory and the driver's arrays, many in one call: the step
results of every ready slice gathered, and the actions of every slice scattered, by address
tables the caller computes with a few vector ops (rlpipe.supervisor.slot_table). Without the
GIL: a round's copies do not hold up the update thread."""
from libc.stdint cimport int64_t, uint8_t, uintptr_t
from libc.string cimport memcpy


def copy_spans(const int64_t[::1] src, const int64_t[::1] dst, const int64_t[::1] nbytes):
    """memcpy(dst[i], src[i], nbytes[i]) for every i (addresses as int64; the caller keeps the
    memory they point into alive and the spans apart)."""
    cdef Py_ssize_t i, n = src.shape[0]
    if dst.shape[0] != n or nbytes.shape[0] != n:
        raise ValueError("copy_spans: src, dst and nbytes differ in length")
    with nogil:
        for i in range(n):
            if nbytes[i] > 0:
                memcpy(<void*><uintptr_t>dst[i], <const void*><uintptr_t>src[i], <size_t>nbytes[i])
