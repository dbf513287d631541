"""The rgb encoder: a Nature-CNN-sized conv stack over HxWxC images, run at a fixed ladder of
batch sizes, and the images of a PPO update prepared for it once (`ImageRows`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    """CleanRL's init (orthogonal weights, constant bias), for the conv stack and the towers."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


PAD_FLOOR = 8  # the smallest batch the CNN runs at


def padded_rows(n: int) -> int:
    """The batch size the CNN runs at for `n` rows: the next of a fixed ladder of sizes
    (multiples of 8, each at most 1/8 above the one before: 46 sizes up to 8,000 rows).

    Why: oneDNN, torch's CPU convolution, builds and caches a primitive (JIT code and
    buffers, about 1 MB here) for every input shape it meets, up to 1,024 of them. The rgb
    rows of an inference round or a minibatch number anything from 1 to thousands, so a
    days-long driver met a new shape every few rounds and its RSS climbed for hours (1,200
    rounds of random sizes: +400 MB, against flat with this ladder). Padded rows are zeros
    whose outputs are cut off before anything reads them, so no value or gradient changes.
    """
    size = PAD_FLOOR
    while size < n:
        size = max(size + 8, -(-size * 9 // 8) // 8 * 8)
    return size


class PaddedInput:
    """One buffer for the conv stack's padded input ([rows, H, W, C]), reused by every
    minibatch of an update.

    Why: the driver maps every block of 4 MB or more on its own and unmaps it when freed
    (`run.mmap_threshold_mb`, rlpipe/heap.py), so a fresh 20 MB input per minibatch was 5,000
    page faults to fill. Reuse is safe because each minibatch's backward pass ends before the
    next forward; a graph still holding the buffer would fail its backward (autograd's version
    check), not read new rows."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def rows(self, n: int, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """The first `n` rows of the buffer (grown to hold them)."""
        if self.buffer is None or len(self.buffer) < n:
            self.buffer = torch.empty((n,) + shape, dtype=like.dtype, device=like.device)
        return self.buffer[:n]


@dataclass(frozen=True)
class ImageRows:
    """Images already in the conv stack's layout and scale (`RgbEncoder.inputs`), and which of
    them a batch takes, in its order. Indexing picks rows without moving pixels; the encoder
    gathers them straight into its padded input (one buffer for all of them). A PPO update's
    minibatches are these (Policy.prepared_obs): each image is converted and scaled once an
    update instead of once an epoch, and copied once a minibatch instead of gathered,
    converted and divided."""

    images: torch.Tensor  # [N, H, W, C] float32
    rows: torch.Tensor  # int64 indices into images
    padded: PaddedInput = field(default_factory=PaddedInput)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx) -> ImageRows:
        return ImageRows(self.images, self.rows[idx], self.padded)

    def index_select(self, dim: int, idx: torch.Tensor) -> ImageRows:
        """Rows `idx` in that order, as a tensor's index_select along dim 0 (ppo._take)."""
        if dim != 0:
            raise ValueError("ImageRows picks rows: dim must be 0")
        return ImageRows(self.images, self.rows.index_select(0, idx), self.padded)


class RgbEncoder(nn.Module):
    """Nature-CNN-sized conv stack for HxWxC uint8 or float images (or `ImageRows`); the conv
    layers see only the batch sizes of `padded_rows`.

    The stack runs channels-last: its weights and inputs keep the channels innermost, as the
    board keeps the pixels, and each input is the [N, H, W, C] buffer seen as [N, C, H, W].
    oneDNN's convolution takes that layout directly. In the NCHW layout it took 1.5x the time
    over a day4 minibatch's 216 rgb rows, forward and backward, on one thread
    (docs/benchmarks.md, "The rgb encoder channels-last"). The flattened features are the
    same (C, H, W) order either way, so the fc layer and a checkpoint read them alike."""

    def __init__(self, shape: tuple[int, int, int], channels: tuple[int, int, int] = (32, 64, 64), out: int = 256):
        super().__init__()
        h, w, c = shape
        c1, c2, c3 = channels
        # ReLU in place: each overwrites a layer's fresh output, which no backward reads (a
        # convolution's keeps its input and weight), instead of mapping another 6 MB at day4
        self.conv = nn.Sequential(
            layer_init(nn.Conv2d(c, c1, 8, stride=4)),
            nn.ReLU(inplace=True),
            layer_init(nn.Conv2d(c1, c2, 4, stride=2)),
            nn.ReLU(inplace=True),
            layer_init(nn.Conv2d(c2, c3, 3, stride=1)),
            nn.ReLU(inplace=True),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(layer_init(nn.Linear(n, out)), nn.ReLU(inplace=True))
        self.conv.to(memory_format=torch.channels_last)
        self.out = out
        self.in_shape = (h, w, c)

    def inputs(self, rgb: torch.Tensor) -> torch.Tensor:
        """[N, H, W, C] images as the conv stack takes them: float32, uint8 scaled to [0, 1]."""
        return _conv_input(torch.empty((len(rgb),) + self.in_shape, device=rgb.device), rgb)

    def forward(self, rgb: torch.Tensor | ImageRows) -> torch.Tensor:
        n = len(rgb)
        if isinstance(rgb, ImageRows):
            x = rgb.padded.rows(padded_rows(n), self.in_shape, rgb.images)
            torch.index_select(rgb.images, 0, rgb.rows, out=x[:n])
        else:
            x = torch.empty((padded_rows(n),) + self.in_shape, device=rgb.device)
            _conv_input(x[:n], rgb)
        x[n:] = 0.0
        return self.fc(self.conv(x.permute(0, 3, 1, 2))[:n])


def _conv_input(x: torch.Tensor, rgb: torch.Tensor) -> torch.Tensor:
    """`rgb` ([N, H, W, C]) into `x` (the same shape, float32): one copy for the cast, then
    uint8 divided by 255 in place."""
    x.copy_(rgb)
    if rgb.dtype == torch.uint8:
        x /= 255.0
    return x
