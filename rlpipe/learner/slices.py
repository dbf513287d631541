"""What the driver hands the learner per doorbell (kept free of torch so the driver can import
it before the learner is built)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlpipe.protocol import SliceSource


@dataclass
class SliceRef:
    """One ready slice: its worker's handle and the env range inside that worker."""

    handle: SliceSource  # the interface in rlpipe/protocol.py (the driver's WorkerHandle)
    slice_index: int
    seq: int
    generation: int  # the worker generation that rang: older ones are stale
