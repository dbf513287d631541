"""Self-checking board payloads, for the torn-read tests and the board benchmark.

Every staged row checks itself: word 0 is a tag (writer id << 56 | publish number), the body
is random, the last word is (tag + sum(body)) ^ MAGIC. A reader counts a row as torn when the
checksum fails or the keys of one env disagree, and as stale when an env's tag goes back.
"""

from __future__ import annotations

import numpy as np

MAGIC = np.uint64(0x9E3779B97F4A7C15)
N_BODIES = 7  # odd: consecutive publishes into one slot always differ in body


class Payloads:
    """Staged rows for `count` envs; N_BODIES random bodies, tag and checksum set per publish."""

    def __init__(self, row_bytes, count, writer_id, seed):
        rng = np.random.default_rng(seed)
        self.writer_id = writer_id
        self.stage = [
            [rng.integers(0, 2**63, size=(count, rb // 8), dtype=np.uint64) for rb in row_bytes]
            for _ in range(N_BODIES)
        ]
        self.sums = [[s[:, 1:-1].sum(axis=1, dtype=np.uint64) for s in st] for st in self.stage]
        self.ptrs = [[s.ctypes.data for s in st] for st in self.stage]
        self.strides = [s.strides[0] for s in self.stage[0]]

    def fill(self, k: int):
        """Stage publish number k; returns the row pointers."""
        p = k % N_BODIES
        tag = np.uint64((self.writer_id << 56) | k)
        for s, body_sum in zip(self.stage[p], self.sums[p]):
            s[:, 0] = tag
            s[:, -1] = (tag + body_sum) ^ MAGIC
        return self.ptrs[p]


def check_rows(outs, n=None):
    """(ok mask, tags) of gathered rows (one uint64 array per key, one row per env)."""
    n = len(outs[0]) if n is None else n
    tags = outs[0][:n, 0].copy()
    ok = np.ones(n, dtype=bool)
    for o in outs:
        rows = o[:n]
        ok &= rows[:, -1] == ((rows[:, 0] + rows[:, 1:-1].sum(axis=1, dtype=np.uint64)) ^ MAGIC)
        ok &= rows[:, 0] == tags
    return ok, tags
