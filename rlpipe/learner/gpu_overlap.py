"""Serving beside the update on a GPU: the copies of a round between the host and the device,
and the update's kernels on a CUDA stream of their own.

On a CPU learner (and on any device but cuda) both are what they were: a tensor over the
numpy array, `.cpu().numpy()` back; the update runs where it is called.

With `learner.device=cuda`:

- **The update's stream.** Torch queues every thread's kernels on the device's default stream
  unless told otherwise, so each inference round of the serving thread would wait behind
  whatever the update thread had queued (a minibatch's forward, backward and Adam step). The
  update runs on a stream of its own (torch's streams do not synchronize with the default
  one), so the GPU runs a round's few kernels beside the update's. Its order with serving is
  kept by hand: the stream first waits for the batch's copies, queued by the serving thread
  (`batch_queued`), and the update's thread returns only once its kernels have all run, so
  the serving copy of the policy (`_refresh_actor`, on the default stream) reads finished
  weights and the batch's memory, freed in that thread, is no longer read by a kernel.
- **A round's copies.** A round's obs go to the device through pinned host buffers (a copy
  from pageable memory goes through the CUDA driver's own staging buffer first, and a
  non-blocking copy from it is not asynchronous at all), and its results (actions, log-probs, values, the
  exploration alternatives) come back into pinned buffers with one synchronization for all
  of them instead of one per tensor. The buffers are reused round after round: what
  `to_host` returns is valid until its next call with the same name, which is the next round
  (the driver scatters a round's actions and books its rollouts before it serves the next).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch


class UpdateStream:
    """Where the PPO update's kernels run: a CUDA stream of its own on cuda, else inline."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self._batch_copied: torch.cuda.Event | None = None

    def batch_queued(self) -> None:
        """Serving thread, once the batch's copies to the device are queued on its stream."""
        if self.stream is not None:
            self._batch_copied = torch.cuda.current_stream(self.stream.device).record_event()

    @contextlib.contextmanager
    def running(self):
        """The update's thread: its kernels on the stream, after the batch's copies; on leaving,
        every kernel it queued has run."""
        if self.stream is None:
            yield
            return
        if self._batch_copied is not None:
            self.stream.wait_event(self._batch_copied)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            self.stream.synchronize()


class HostStaging:
    """A round's tensors to the device and its results back to numpy (pinned buffers on cuda)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self._to_device: dict[str, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        self._to_host: dict[str, torch.Tensor] = {}

    def to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        """`array` on the device (a view of it on the CPU). On cuda it goes through the pinned
        buffer `name`, whose last copy out has finished before it is written again."""
        host = torch.from_numpy(array)
        if not self.pinned:
            return host.to(self.device)
        buffer, copied = self._to_device.get(name, (None, None))
        if copied is not None:
            copied.synchronize()  # done by now (a round ends on a synchronization): a check
        buffer = _fitting(buffer, host)
        buffer.copy_(host)
        on_device = buffer.to(self.device, non_blocking=True)
        self._to_device[name] = (_base(buffer), torch.cuda.current_stream(self.device).record_event())
        return on_device

    def to_host(self, tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """The tensors as numpy arrays, after one synchronization on cuda (views of pinned
        buffers reused by the next call: see the module's note)."""
        if not self.pinned:
            return {name: t.cpu().numpy() for name, t in tensors.items()}
        out = {}
        for name, t in tensors.items():
            buffer = _fitting(self._to_host.get(name), t)
            buffer.copy_(t, non_blocking=True)
            self._to_host[name] = _base(buffer)
            out[name] = buffer
        torch.cuda.current_stream(self.device).synchronize()
        return {name: buffer.numpy() for name, buffer in out.items()}


def _fitting(base: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A pinned host tensor shaped and typed as `like`: a view of `base` where it is large
    enough and of that dtype, else a new one with a quarter to spare (rounds vary in size)."""
    n = like.numel()
    if base is None or base.dtype != like.dtype or base.numel() < n:
        base = torch.empty(max(n + n // 4, 1), dtype=like.dtype, pin_memory=True)
    return base[:n].view(like.shape)


def _base(view: torch.Tensor) -> torch.Tensor:
    """The whole buffer a `_fitting` view was cut from (kept for the next round)."""
    return view._base if view._base is not None else view
