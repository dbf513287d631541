"""`Thinned`: a time series that stays bounded however long the run lasts (`ThinnedPairs`: one
of float pairs, in two arrays); `FigureRow`: one sample of named figures in a few Python objects.

A six-day run must not keep one Python object per sample, update or episode: a list that
grows by one entry per PPO update is 23,000 entries after six days at day4's pace, and
nothing of it is needed at full resolution. `Thinned` keeps at most `capacity` points spread
over the whole run: when it is full it drops every other point and from then on keeps only
every second (fourth, ...) point offered. The points it holds are always evenly thinned in
arrival order, so a fit or a std over any part of the run (its second half, say) is taken on
an unbiased sample of that part. It imports nothing of rlpipe, so every layer may use it.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping


class Thinned:
    __slots__ = ("capacity", "points", "stride", "_skip", "offered")

    def __init__(self, capacity: int):
        if capacity < 2:
            raise ValueError(f"Thinned capacity must be >= 2, got {capacity}")
        self.capacity = capacity
        self.points: list = []
        self.stride = 1  # one point kept of every `stride` offered
        self._skip = 0  # points still to drop before the next one is kept
        self.offered = 0  # every point ever offered, kept or not

    def add(self, point) -> None:
        self.offered += 1
        if self._skip:
            self._skip -= 1
            return
        self._keep(point)
        self._skip = self.stride - 1
        if len(self) >= self.capacity:
            # keep the 1st, 3rd, 5th...: the survivors are `stride * 2` apart, and so are the
            # points kept from now on (the next one is `stride * 2` after the last survivor)
            last_kept_index = len(self) - 1
            self._halve()
            self.stride *= 2
            self._skip = self.stride - 1 - (self.stride // 2 if last_kept_index % 2 else 0)

    def _keep(self, point) -> None:
        self.points.append(point)

    def _halve(self) -> None:
        self.points = self.points[::2]

    def __len__(self) -> int:
        return len(self.points)

    def __iter__(self):
        return iter(self.points)


class ThinnedPairs(Thinned):
    """A `Thinned` of (x, y) pairs of floats, held in two arrays of doubles: no Python object
    per point. A tuple of two floats is three object blocks, and the loss history gains a
    point per PPO update (2,800 an hour at day4 on 2 CPUs): kept as tuples, its 4,096 points
    climbed the driver's block count, the long run's leak detector, for an hour and a half.
    It keeps the same points a `Thinned` of tuples keeps, and iterates them as tuples."""

    __slots__ = ("xs", "ys")

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.xs, self.ys = array("d"), array("d")

    def _keep(self, point: tuple[float, float]) -> None:
        x, y = point
        self.xs.append(x)
        self.ys.append(y)

    def _halve(self) -> None:
        self.xs, self.ys = self.xs[::2], self.ys[::2]

    def __len__(self) -> int:
        return len(self.xs)

    def __iter__(self):
        return zip(self.xs, self.ys)


class FigureRow(Mapping):
    """One sample of named figures, read as a dict: its values in one array of doubles, its
    names in a dict (name -> position) shared by every row of the same names.

    A dict of 48 figures is about 50 Python objects (a float per value, a name per built
    key); a row is three. The resource history keeps 720 samples, and the driver's count of
    Python object blocks, which the long run watches for leaks, climbed by 37k while that
    history filled (an hour) as dicts; as rows it climbs by 3-4k. Ints (fds, rows) are kept
    exactly up to 2**53."""

    __slots__ = ("index", "values")

    def __init__(self, figures: dict[str, float], like: FigureRow | None = None):
        """`like`: the previous row; its index is shared when the names are the same."""
        index = like.index if like is not None and like.index.keys() == figures.keys() else None
        if index is None:
            index = {name: i for i, name in enumerate(figures)}
        self.index = index
        self.values = array("d", [figures[name] for name in index])

    def __getitem__(self, name: str) -> float:
        return self.values[self.index[name]]

    def __iter__(self):
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)
