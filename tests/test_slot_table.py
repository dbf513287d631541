"""The slot table's guard: a round that names a slot twice is refused before any copy (its
buffers hold one row per env; the raw copies would run past them)."""

from __future__ import annotations

import numpy as np
import pytest

from rlpipe.spec import ObsKey
from rlpipe.supervisor.slot_table import SlotTable


def test_a_slot_named_twice_in_a_round_is_refused_before_any_copy():
    table = SlotTable(2, [0], np.zeros(4, dtype=np.int64), (ObsKey("state", (4,), "float32"),), 0)
    table.count[:] = 2  # two slices of two envs; no worker attached: a copy would fault
    with pytest.raises(RuntimeError, match="served twice"):
        table.recv(np.array([1, 1]), np.array([3, 3]))
