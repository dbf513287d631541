"""A PPO batch's way to the update process: copied into shared-memory tensors that stay, one per
field, and reused update after update; what goes down the pipe is each field's row count.

Why: sent as fresh tensors, every batch was moved to shared memory on the way (torch's
file-descriptor passing: a segment made, the rows copied in, a descriptor handed over per
tensor, and the process mapping each), about 2 ms of the serving thread per update of 8,960
CartPole samples, more than making the batch (docs/benchmarks.md, "The batch's way to the
update process"). Here a field's buffer is made once, with room for a slightly larger batch
than the first, and sent once; a batch that outgrows it gets a new one, sent with that batch.

A buffer is written only while no update is in flight: the learner starts an update once the
last one's reply is in (`BackgroundTraining.update_due`), and the process answers only when
the update is over and its batch dropped. `UpdateProcess.begin` keeps that order.
"""

from __future__ import annotations

import torch

HEADROOM = 1.25  # a batch is about update_samples plus part of one block: room for the next's


def _leaves(tree: dict, prefix: str = ""):
    """(path, tensor) of every tensor in a nested dict of tensors."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaves(value, path + "/")
        else:
            yield path, value


def _shape_of(tree: dict, counts: dict, prefix: str = "") -> dict:
    """The batch's nesting with each tensor's row count in its place (empty dicts kept)."""
    return {
        key: _shape_of(value, counts, f"{prefix}{key}/") if isinstance(value, dict) else counts[f"{prefix}{key}"]
        for key, value in tree.items()
    }


class BatchSender:
    """The driver's side: `stage(batch)` copies the batch into the buffers and returns what the
    pipe carries, (the batch's shape with row counts, the buffers new since the last batch)."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def stage(self, batch: dict) -> tuple[dict, dict[str, torch.Tensor]]:
        counts, fresh = {}, {}
        for path, tensor in _leaves(batch):
            buf = self.buffers.get(path)
            rows = len(tensor)
            if buf is None or buf.dtype != tensor.dtype or buf.shape[1:] != tensor.shape[1:] or len(buf) < rows:
                size = (max(rows, int(rows * HEADROOM)),) + tuple(tensor.shape[1:])
                buf = self.buffers[path] = fresh[path] = torch.empty(size, dtype=tensor.dtype).share_memory_()
            buf[:rows].copy_(tensor)
            counts[path] = rows
        return _shape_of(batch, counts), fresh


class BatchReceiver:
    """The update process's side: the buffers as they came, and each batch as views of them."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def batch(self, shape: dict, fresh: dict[str, torch.Tensor]) -> dict:
        self.buffers.update(fresh)  # a grown buffer replaces its predecessor, which is unmapped
        return self._views(shape, "")

    def _views(self, shape: dict, prefix: str) -> dict:
        return {
            key: self._views(value, f"{prefix}{key}/")
            if isinstance(value, dict)
            else self.buffers[f"{prefix}{key}"][:value]
            for key, value in shape.items()
        }
