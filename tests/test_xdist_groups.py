"""`make test` runs the suite on pytest-xdist workers with `--dist loadgroup` (Makefile), and the
tests that read one shared run are one xdist group each (tests/conftest.py, SHARED_RUNS), so the
run is made once. xdist schedules a group by the `@group` it appends to its tests' node ids;
pytest 9.2's structured node ids drop that suffix without a word (pytest-xdist#1386), and every
worker would make its own copy of each shared run. This test says so instead."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("probe")
def test_a_grouped_test_is_scheduled_with_its_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith("@probe"), (
        f"{request.node.nodeid}: this pytest and pytest-xdist do not group tests (the test extra's pins)"
    )
