"""Every slice of every worker as a slot of address tables, and one inference round's moves
through shared memory done for all ready slices at once: the slice engine's data plane.

A slot is one slice of one worker: worker k's slices are slots [slot_lo, slot_lo + slices),
the doorbell board's numbering. For the worker generation whose segment is current, the table
holds each slot's first row address in every step-result and action field, its act word, its
worker's bell, and each worker's board handle. A round then costs the same few numpy and
native calls however many slices are ready (at 7,000 envs, about a hundred):

- `recv(slots, seqs)`: the obs of every ready slice (`board.gather_slices`: the seqlock reads
  of all of them in one call), their step results (`spans.copy_spans` over every results
  field), and the final obs of the rows whose episode a time limit ended, into preallocated
  arrays, handed out as a `Round` of views;
- `send(slots, seqs, actions)`: the action fields scattered back (`copy_spans`), then each slice's
  act word stored and each worker's bell rung once (`bell.ring_words`).

What the learner sees is a Round's arrays: never a worker, its segment or a field's address.
A restarted worker reaches it as data too: its slices' first ring has seq 0.
"""

from __future__ import annotations

import numpy as np

from rlpipe.native.bell import ring_words
from rlpipe.native.board import gather_slices
from rlpipe.native.spans import copy_spans
from rlpipe.protocol import Round, batch_rows, stepped_rows

# The step results a round gathers (rlpipe.shm.layout's results but the final obs rows, which
# are gathered by row: only those of time-limit truncations, or of every end in rlpipe.vector).
RESULT_FIELDS = (
    "reward",
    "reward_raw",
    "terminated",
    "truncated",
    "final",
    "step_ms",
    "ep_return",
    "ep_len",
    "score",
    "exec_discrete",
    "exec_continuous",
    "behaviour_logp",
)


class SlotTable:
    def __init__(self, n_slots: int, worker_env_lo: list[int], env_type: np.ndarray, obs_keys, cont_dim: int):
        """`worker_env_lo`: each worker's first env id, ascending; `env_type`: each env's type."""
        n_workers, env_count = len(worker_env_lo), len(env_type)
        self.n_slots = n_slots
        self.env_type = env_type.astype(np.int64)
        self.obs_keys = tuple(obs_keys)
        self.count = np.zeros(n_slots, dtype=np.int64)
        self.env_lo = np.zeros(n_slots, dtype=np.int64)  # global env id of the slot's first row
        self.local_lo = np.zeros(n_slots, dtype=np.int64)  # its row inside the worker's segment
        self.worker = np.zeros(n_slots, dtype=np.int64)
        self.generation = np.zeros(n_slots, dtype=np.int64)  # the worker generation the addresses are of
        self.ordinal = np.zeros(n_slots, dtype=np.int64)  # worker_id * slices + slice (staggering)
        self.act_word = np.zeros(n_slots, dtype=np.uint64)
        self.bell = np.zeros(n_slots, dtype=np.uint64)
        self.boards: list = [None] * n_workers
        self.views: list = [None] * n_workers  # each worker's current views: its mapping stays
        self.worker_env_lo = np.asarray(worker_env_lo, dtype=np.int64)
        cd = (max(cont_dim, 1),)
        self.result_shapes = {
            "reward": ("float32", ()),
            "reward_raw": ("float32", ()),
            "terminated": ("uint8", ()),
            "truncated": ("uint8", ()),
            "final": ("uint8", ()),
            "step_ms": ("float32", ()),
            "ep_return": ("float32", ()),
            "ep_len": ("int32", ()),
            "score": ("float32", ()),
            "exec_discrete": ("int32", ()),
            "exec_continuous": ("float32", cd),
            "behaviour_logp": ("float32", ()),
        }
        self.action_shapes = {
            "discrete": ("int32", ()),
            "continuous": ("float32", cd),
            "logp": ("float32", ()),
            "alt_discrete": ("int32", ()),
            "alt_continuous": ("float32", cd),
            "alt_logp": ("float32", ()),
        }
        # per field: bytes per env, the slots' first-row addresses, and a buffer of a row per env
        self.result_bytes = np.array([_row_bytes(*self.result_shapes[f]) for f in RESULT_FIELDS], dtype=np.int64)
        self.result_addr = np.zeros((n_slots, len(RESULT_FIELDS)), dtype=np.int64)
        self.result_buf = {f: np.zeros((env_count,) + shape, dtype=dt) for f, (dt, shape) in self.result_shapes.items()}
        self.result_base = np.array([self.result_buf[f].ctypes.data for f in RESULT_FIELDS], dtype=np.int64)
        self.action_fields = tuple(self.action_shapes)
        self.action_bytes = {f: _row_bytes(*self.action_shapes[f]) for f in self.action_fields}
        self.action_addr = {f: np.zeros(n_slots, dtype=np.int64) for f in self.action_fields}
        self.obs_buf = {k.name: np.zeros((env_count,) + k.shape, dtype=k.dtype) for k in self.obs_keys}
        self.obs_ptrs = [self.obs_buf[k.name].ctypes.data for k in self.obs_keys]
        self.obs_strides = [k.nbytes for k in self.obs_keys]
        # final obs: per worker the address of its final_<key> rows; a buffer grown on demand
        self.final_addr = {k.name: np.zeros(n_workers, dtype=np.int64) for k in self.obs_keys}
        self.final_buf = {k.name: np.zeros((64,) + k.shape, dtype=k.dtype) for k in self.obs_keys}

    # -- the workers' segments ------------------------------------------------------------------
    def attach(self, h) -> None:
        """Worker handle `h` has a new segment (a new generation): its slots point there now."""
        views, layout = h.views, h.layout
        base = views.segment.base
        n = len(h.bounds)
        slots = np.arange(h.slot_lo, h.slot_lo + n)
        lo = np.array([b[0] for b in h.bounds], dtype=np.int64)
        self.count[slots] = [b[1] - b[0] for b in h.bounds]
        self.local_lo[slots] = lo
        self.env_lo[slots] = h.env_lo + lo
        self.worker[slots] = h.worker_id
        self.generation[slots] = h.generation
        self.ordinal[slots] = h.worker_id * n + np.arange(n)
        self.act_word[slots] = views.act_addr + 8 * np.arange(n, dtype=np.uint64)
        self.bell[slots] = views.bell_addr
        for j, f in enumerate(RESULT_FIELDS):
            self.result_addr[slots, j] = base + layout.results[f][0] + lo * self.result_bytes[j]
        for f in self.action_fields:
            self.action_addr[f][slots] = base + layout.actions[f][0] + lo * self.action_bytes[f]
        for k in self.obs_keys:
            self.final_addr[k.name][h.worker_id] = base + layout.results[f"final_{k.name}"][0]
        self.boards[h.worker_id] = views.board
        self.views[h.worker_id] = views

    def close(self) -> None:
        """Let go of every segment's views (before the segments are unmapped)."""
        self.boards = [None] * len(self.boards)
        self.views = [None] * len(self.views)

    # -- a round --------------------------------------------------------------------------------
    def recv(self, slots: np.ndarray, seqs: np.ndarray) -> Round:
        """The obs and step results of the ready `slots` (each at most once), as one batch.
        A slot given twice is refused here, before a copy: the buffers hold one row per env."""
        if len(np.unique(slots)) != len(slots):
            raise RuntimeError(f"a round of {len(slots)} slots names some twice: a slice was served twice")
        counts = self.count[slots]
        starts, rows = batch_rows(self.env_lo[slots], counts)
        n = len(rows)
        torn = gather_slices(
            self.boards, self.worker[slots], self.local_lo[slots], counts, self.obs_ptrs, self.obs_strides
        )
        src = self.result_addr[slots]  # [k, fields]
        dst = self.result_base[None, :] + starts[:, None] * self.result_bytes[None, :]
        copy_spans(src.ravel(), dst.ravel(), (counts[:, None] * self.result_bytes[None, :]).ravel())
        results = {f: self.result_buf[f][:n] for f in RESULT_FIELDS}
        stepped, final_rows = stepped_rows(seqs, counts, results["final"][:n])
        final_obs = self._finals(rows[final_rows])
        return Round(
            slots=slots,
            seqs=seqs,
            starts=starts,
            counts=counts,
            rows=rows,
            types=self.env_type[rows],
            obs={k: v[:n] for k, v in self.obs_buf.items()},
            results=results,
            stepped=stepped,
            final_rows=final_rows,
            final_obs=final_obs,
            torn_retries=int(torn),
        )

    def _finals(self, envs: np.ndarray) -> dict:
        """The final obs rows of these env ids, copied out of their workers' segments."""
        m = len(envs)
        if not m:
            return {k: v[:0] for k, v in self.final_buf.items()}
        owner = np.searchsorted(self.worker_env_lo, envs, side="right") - 1
        local = envs - self.worker_env_lo[owner]
        out = {}
        for k in self.obs_keys:
            buf = self.final_buf[k.name]
            if len(buf) < m:
                buf = self.final_buf[k.name] = np.zeros((max(m, 2 * len(buf)),) + k.shape, dtype=k.dtype)
            copy_spans(
                self.final_addr[k.name][owner] + local * k.nbytes,
                buf.ctypes.data + np.arange(m, dtype=np.int64) * k.nbytes,
                np.full(m, k.nbytes, dtype=np.int64),
            )
            out[k.name] = buf[:m]
        return out

    def send(self, slots: np.ndarray, seqs: np.ndarray, actions: dict) -> None:
        """Scatter `actions` (field -> [n, ...] array, any of the action fields; the rows of
        `slots` one after another, as `recv` made them) into the slices' segments, then ring
        each slice (its step `seqs`) and each worker's bell once."""
        counts = self.count[slots]
        starts = np.cumsum(counts) - counts
        for f, arr in actions.items():
            b = self.action_bytes[f]
            if arr.dtype != np.dtype(self.action_shapes[f][0]) or not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr, dtype=self.action_shapes[f][0])
                actions[f] = arr  # kept alive by the caller's dict until the copy is done
            copy_spans(arr.ctypes.data + starts * b, self.action_addr[f][slots], counts * b)
        ring_words(self.act_word[slots], (seqs + 1).astype(np.uint64), np.unique(self.bell[slots]))


def _row_bytes(dtype: str, shape: tuple) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
