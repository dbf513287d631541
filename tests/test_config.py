"""Config composition of every group option through Hydra's compose API, and clear errors."""
from __future__ import annotations

import pytest

from conftest import REPO, compose_cfg, run_cli
from rlpipe.config import ConfigError, conf_dir, to_plain

GROUPS = sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name not in ("env", "stage"))


def group_options():
    for group in GROUPS:
        for option in sorted((conf_dir() / group).glob("*.yaml")):
            yield group, option.stem


@pytest.mark.parametrize("group,option", list(group_options()))
def test_every_group_option_composes_and_validates(group, option):
    overrides = [f"{group}={option}"]
    if group == "env_mix" and option == "gym":
        overrides.append("env_mix.id=CartPole-v1")
    cfg = compose_cfg(overrides)
    spec = to_plain(cfg)
    assert spec.env_count == cfg.env_count


def test_defaults_are_plain_values():
    spec = to_plain(compose_cfg())
    assert spec.env_types[0].name == "cartpole"
    assert [k.name for k in spec.obs_keys] == ["rgb", "state", "vector"]
    assert spec.redis_url is None
    assert isinstance(spec.learner.hidden, tuple)


@pytest.mark.parametrize("override,key", [
    ("env_count=0", "env_count"),
    ("env_count=-5", "env_count"),
    ("buffer.keys.state.shape=[0]", "buffer.keys.state.shape"),
    ("buffer.keys.state.shape=[4,-1]", "buffer.keys.state.shape"),
    ("buffer.sync=spin", "buffer.sync"),
    ("learner.gamma=1.5", "learner.gamma"),
    ("worker.start_method=fork", "worker.start_method"),
    ("redis.url=localhost:6379", "redis.url"),
    ("run.duration_s=null", "run.duration_s"),
    ("worker.slices=often", "worker.slices"),
    ("worker.slices=0", "worker.slices"),
    ("worker.slices=71", "worker.slices"),
])
def test_bad_values_raise_config_error_naming_the_key(override, key):
    overrides = [override] + (["run.total_env_steps=null"] if key == "run.duration_s" else [])
    with pytest.raises(ConfigError) as err:
        to_plain(compose_cfg(overrides))
    assert key in str(err.value)
    assert "allowed" in str(err.value)


def test_worker_slices_auto_double_buffers_only_few_workers(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    slices = {n: to_plain(compose_cfg([f"env_count={n}"])).worker_slices for n in (1, 64, 210, 280, 7000)}
    assert slices == {1: 1, 64: 2, 210: 2, 280: 1, 7000: 1}      # 1 env: at most the group; 4 workers: 1
    assert to_plain(compose_cfg(["env_count=7000", "worker.slices=3"])).worker_slices == 3


def test_cli_bad_value_is_one_paragraph_no_traceback(short_tmp):
    out = run_cli(short_tmp / "run", "env_count=0", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "env_count=0" in out.stderr and "positive integer" in out.stderr
    assert not (short_tmp / "run" / "summary.json").exists()


def test_cli_unknown_group_option_lists_what_is_allowed(short_tmp):
    out = run_cli(short_tmp / "run", "buffer=huge", timeout=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "buffer/huge" in out.stderr and "state_only" in out.stderr


def test_cli_wrong_type_is_clear(short_tmp):
    out = run_cli(short_tmp / "run", "env_count=many", timeout=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "env_count" in out.stderr


def test_env_type_that_does_not_fit_the_buffer(short_tmp):
    out = run_cli(short_tmp / "run", "buffer.keys.state.shape=[2]", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "buffer.keys.state.shape" in out.stderr and "cartpole" in out.stderr


def test_conf_dir_is_the_repository_one():
    assert conf_dir() == REPO / "conf"


STAGES = sorted(p.stem for p in (conf_dir() / "stage").glob("day*.yaml"))


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_composes_and_validates(stage):
    spec = to_plain(compose_cfg([f"+stage={stage}"]))
    assert spec.stage == stage


def test_stage_env_count_is_overridable_and_day4_is_the_seed12_mix():
    spec = to_plain(compose_cfg(["+stage=day4", "env_count=1234"]))
    assert spec.env_count == 1234
    assert len(spec.env_types) == 12
    # a stage's tuning of types outside the mix is left out, not an error
    assert [t.name for t in to_plain(compose_cfg(["+stage=day5", "env_mix=cartpole"])).env_types] == ["cartpole"]


def test_over_budget_config_is_refused_with_the_arithmetic(short_tmp):
    out = run_cli(short_tmp / "run", "+stage=day4", "buffer=seed", "learner.rollout_len=64", timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "rollout storage env_count 7000 x learner.rollout_len 64" in out.stderr
    assert "GiB usable here" in out.stderr
    assert not (short_tmp / "run" / "summary.json").exists()
