"""The driver's C heap: glibc malloc settings that keep a days-long process's resident set near
its live bytes, and the figures that tell live bytes from the free bytes malloc keeps.

Why: the driver allocates and frees arrays of many sizes from several threads for days (the
ready blocks of each slice, one PPO batch per update and its activations, inference batches;
torch's intra-op threads and the update thread each get a malloc arena of their own). glibc
hands a freed chunk back to the kernel only when it sits at the top of its heap, and its
mmap threshold grows with every large block freed (up to 32 MiB), so after an hour most
large arrays live in the arenas, and the holes between long-lived small objects stay
resident: RSS climbs while the live bytes do not. Two settings answer it:

- `mmap_threshold_mb`: a fixed threshold (which also stops the dynamic growth): every block
  at least that large is its own mapping, returned to the kernel when freed;
- `trim_after_update`: `malloc_trim(0)` after each PPO update (in the update thread, off the
  serving loop), which returns the free pages inside every arena, not only at the top.

A third keeps the first from costing every inference round:

- `trim_threshold_mb`: how much free memory may sit at the top of a heap before `free` hands
  it back. Fixing the mmap threshold also fixes this one at glibc's 128 KiB, where it no
  longer follows the mmap threshold up. A round's arrays under 4 MB (the policy's activations
  on 7,000 rows: 1.8 MB each) are then given back as each round frees them and faulted in
  anew by the next: about 1,200 page faults per 7,000-row forward, up to a third of its
  CPU (docs/benchmarks.md, "The heap's trim threshold"). A top larger than the threshold is
  still given back, and `trim_after_update` still returns every free page where it runs: what
  is kept is bounded by the threshold per arena and does not grow. Kept small (8 MB, enough
  for those activations): at 32 the kept bytes swung the driver's RSS floor by tens of MB
  from sample to sample, and a 10-minute soak read that as growth.

The PPO update process (rlpipe/learner/update_process.py) is not the driver: it allocates the
same sizes every update and holds nothing else, so `keep_freed_blocks` keeps its freed blocks
instead (no trim, no mapping of their own under 32 MB).

`figures()` charts `heap/in_use_mb` (bytes malloc has handed out: live C and Python data),
`heap/free_kept_mb` (free bytes it keeps resident or not) and `python/blocks` (the
interpreter's allocated object blocks), so a growing RSS reads as a leak (in use grows) or as
the allocator's keep (in use flat). Elsewhere than glibc every call is a no-op.
"""

from __future__ import annotations

import ctypes
import sys

MB = 2**20
M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> ctypes.CDLL | None:
    """glibc 2.33 or newer (mallinfo2), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


_LIBC = _glibc()


def configure(
    mmap_threshold_mb: float | None, arena_max: int | None, trim_threshold_mb: float | None = None
) -> str | None:
    """Apply the settings (None: glibc's default); a line to log when they cannot apply."""
    if _LIBC is None:
        return "rlpipe: not glibc 2.33+: run.heap settings ignored (the allocator keeps its defaults)"
    if mmap_threshold_mb is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold_mb * MB))
    if trim_threshold_mb is not None:
        _LIBC.mallopt(M_TRIM_THRESHOLD, int(trim_threshold_mb * MB))
    if arena_max is not None:
        _LIBC.mallopt(M_ARENA_MAX, int(arena_max))
    return None


# glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2): blocks under it can stay in a heap
KEEP_UNDER_MB = 32.0


def keep_freed_blocks() -> str | None:
    """For a process that allocates the same sizes again and again and holds nothing else (the
    PPO update process: one batch and its update's activations): a freed block under
    KEEP_UNDER_MB stays in the heap for the next update, neither unmapped nor trimmed, so its
    pages are not faulted in anew. Its resident set is then its largest update's, every update
    alike. Under glibc's defaults an update's 1-2 MB blocks were unmapped when freed, and
    malloc_trim after each update gave back the rest: about 2,500 page faults an update of
    the 8,960-sample CartPole batch, 7 % of its CPU (docs/benchmarks.md, "The update
    process's heap, and the shuffle's gather"). A line to log where it cannot apply."""
    if _LIBC is None:
        return "rlpipe: not glibc 2.33+: the PPO update process's heap keeps the allocator's defaults"
    return configure(KEEP_UNDER_MB, None, KEEP_UNDER_MB)


def trim() -> None:
    """Return malloc's free pages to the kernel, in every arena."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def figures() -> dict[str, float]:
    """This process's heap, summed over malloc's arenas, and the interpreter's object blocks."""
    out = {"python/blocks": float(sys.getallocatedblocks())}
    if _LIBC is not None:
        info = _LIBC.mallinfo2()
        out["heap/in_use_mb"] = (info.uordblks + info.hblkhd) / MB
        out["heap/free_kept_mb"] = info.fordblks / MB
        out["heap/mmapped_mb"] = info.hblkhd / MB
    return out
