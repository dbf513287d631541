"""Doorbell frames between learner and workers: small fixed structs over ZMQ, never pickles."""
import struct

# worker -> learner: "slice `slice` of worker `worker` (generation) has published step `seq`"
RING = struct.Struct("<IIIQ")
# learner -> worker: "actions for step `seq` of slice `slice` are in the action arrays"
ACT = struct.Struct("<IQ")
STOP_SLICE = 0xFFFFFFFF


def slice_bounds(n_envs: int, slices: int) -> list[tuple[int, int]]:
    """Split a worker's n envs into `slices` contiguous, near-equal, non-empty ranges."""
    slices = max(1, min(slices, n_envs))
    edges = [round(i * n_envs / slices) for i in range(slices + 1)]
    return [(edges[i], edges[i + 1]) for i in range(slices)]
