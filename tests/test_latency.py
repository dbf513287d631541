"""The per-type step latencies charted (rlpipe/learner/latency.py): rounds kept whole and
split by type at chart time give each type exactly its own rows' percentiles."""

import numpy as np

from rlpipe.learner.latency import StepLatencies


def test_percentiles_are_each_types_own_rows():
    rng = np.random.default_rng(3)
    names = ["a", "b", "c", "d"]
    lat = StepLatencies(names)
    rounds = []
    for n in (70, 350, 1, 7000):
        types = rng.choice([0, 1, 3], size=n)  # "c" never steps
        ms = rng.exponential(2.0, size=n).astype(np.float32)
        lat.add(types, ms)
        rounds.append((types, ms))
    got = lat.percentiles()
    types = np.concatenate([t for t, _ in rounds])
    ms = np.concatenate([m for _, m in rounds])
    assert set(got) == {"a", "b", "d"}
    for t, name in enumerate(names):
        if name in got:
            want = np.percentile(ms[types == t], (50, 99))
            assert got[name] == (float(want[0]), float(want[1]))
    assert lat.percentiles() == {}  # since the last call: nothing new


def test_a_round_of_one_type_and_the_caller_reusing_its_types_array():
    lat = StepLatencies(["x", "y"])
    types = np.ones(5, dtype=np.int64)
    lat.add(types, np.arange(5, dtype=np.float32))
    types[:] = 0  # kept as a copy: the caller's array is its own to change
    assert set(lat.percentiles()) == {"y"}
