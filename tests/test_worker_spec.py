"""A WorkerSpec carries the conf/ sections a worker reads nested, under their conf/ names, as
plain twins of the schema's sections (rlpipe/worker/spec.py): same field names, same values,
and a worker unpickles them without the config layer (rlpipe.config sits above the worker)."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

from conftest import REPO, compose_cfg
from rlpipe.config import run_spec
from rlpipe.supervisor.fleet import worker_sections
from rlpipe.worker.spec import WorkerSpec


def test_sections_are_twins_of_the_schema_sections():
    spec = run_spec(compose_cfg(["env_mix=seed12", "worker.cpu_affinity=[0]", "reward_norm.clip=5"]))
    sections = worker_sections(spec)
    assert set(sections) == {"worker", "heartbeat", "scaling", "reward_norm"}
    assert set(sections) <= {f.name for f in dataclasses.fields(WorkerSpec)}
    for name, section in sections.items():
        for f in dataclasses.fields(section):
            expected = (
                spec.learner.gamma
                if (name, f.name) == ("reward_norm", "gamma")
                else getattr(getattr(spec, name), f.name)
            )
            assert getattr(section, f.name) == expected, (name, f.name)
    assert sections["worker"].cpu_affinity == (0,) and sections["reward_norm"].clip == 5
    assert isinstance(sections["worker"].slices, int)  # resolved from auto by the schema


def test_a_worker_unpickles_its_sections_without_the_config_layer():
    spec = run_spec(compose_cfg([]))
    blob = pickle.dumps(worker_sections(spec))
    code = (
        "import pickle, sys; s = pickle.loads(sys.stdin.buffer.read()); "
        "assert s['heartbeat'].redis_interval_s > 0; "
        "bad = [m for m in sys.modules if m.startswith('rlpipe.config')]; "
        "assert not bad, bad"
    )
    res = subprocess.run([sys.executable, "-c", code], input=blob, cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()[-2000:]
