"""Images onto the board's rgb shape: nearest-neighbour resize and channel mapping, numpy only.

The board's rgb shape is fixed by `buffer.keys.rgb.shape` (check_fits demands equality), so every
image env type takes an `rgb_shape` parameter (its config node interpolates it from the buffer)
and renders or resizes to it. Nearest-neighbour with precomputed index arrays: one fancy-index
copy per frame, no interpolation arithmetic, the same cost up or down.
"""

from __future__ import annotations

import numpy as np


def as_rgb_shape(rgb_shape) -> tuple[int, int, int] | None:
    """`rgb_shape` from config (list, tuple or None) as a checked (H, W, C) tuple."""
    if rgb_shape is None:
        return None
    shape = tuple(int(d) for d in rgb_shape)
    if len(shape) != 3 or min(shape) <= 0 or shape[2] not in (1, 3, 4):
        raise ValueError(f"rgb_shape {list(rgb_shape)} is not [height, width, channels] with 1, 3 or 4 channels")
    return shape


class Resizer:
    """Maps HxW or HxWxC uint8 frames of one source shape onto `out` (H, W, C), nearest."""

    def __init__(self, src_shape: tuple[int, ...], out: tuple[int, int, int]):
        h, w = src_shape[0], src_shape[1]
        c_in = src_shape[2] if len(src_shape) == 3 else 1
        oh, ow, oc = out
        self.src_shape = tuple(src_shape)
        self.out = out
        self.identity = tuple(src_shape) == out
        rows = np.minimum(((np.arange(oh) + 0.5) * h / oh).astype(np.intp), h - 1)
        cols = np.minimum(((np.arange(ow) + 0.5) * w / ow).astype(np.intp), w - 1)
        # channels: grey -> repeated, RGBA -> RGB, RGB -> grey keeps the first channel
        chans = np.array([min(c, c_in - 1) for c in range(oc)], dtype=np.intp)
        self._index = np.ix_(rows, cols, chans)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        if frame.ndim == 2:
            frame = frame[:, :, None]
        if self.identity:
            return np.ascontiguousarray(frame, dtype=np.uint8)
        return frame[self._index].astype(np.uint8, copy=False)
