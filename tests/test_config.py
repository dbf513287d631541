"""Config composition of every group option through Hydra's compose API, and clear errors."""

from __future__ import annotations

import pytest

from conftest import REPO, compose_cfg, run_cli
from rlpipe.config import ConfigError, conf_dir, run_spec

GROUPS = sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name not in ("env", "stage"))


def group_options():
    for group in GROUPS:
        for option in sorted((conf_dir() / group).glob("*.yaml")):
            yield group, option.stem


def _keys(spec):
    return {k.name: tuple(k.shape) for k in spec.obs_keys}


def _types(spec):
    return {t.name: t.weight for t in spec.env_types}


CLASSIC = {"cartpole": 1.0, "acrobot": 1.0, "pendulum": 1.0, "mountaincar_cont": 1.0}
# What each group option must change in the plain spec: an option whose values never reach
# the spec (or reach the wrong field) fails here, and a new option without a check fails too.
OPTION_CHECKS = {
    ("buffer", "auto"): lambda s: (
        _keys(s) == {"rgb": (64, 64, 3), "state": (32,), "vector": (16,)} and s.buffer.sizing == "auto"
    ),
    ("buffer", "lowdim"): lambda s: _keys(s) == {"state": (32,), "vector": (16,)} and s.buffer.sync == "seqlock",
    ("buffer", "seed"): lambda s: _keys(s) == {"rgb": (224, 224, 3), "state": (128,), "vector": (64,)},
    ("buffer", "small"): lambda s: (
        _keys(s) == {"rgb": (64, 64, 3), "state": (32,), "vector": (16,)} and s.buffer.sizing == "fixed"
    ),
    ("buffer", "state_only"): lambda s: _keys(s) == {"state": (32,)},
    ("chaos", "off"): lambda s: not s.chaos.enabled,
    ("chaos", "on"): lambda s: (
        (s.chaos.kill_worker_every_s, s.chaos.stop_worker_every_s, s.chaos.kill_redis_at_s) == (30, 45, 20)
    ),
    ("env_mix", "acrobot"): lambda s: _types(s) == {"acrobot": 1.0},
    ("env_mix", "bullet_reacher"): lambda s: _types(s) == {"bullet_reacher": 1.0},
    ("env_mix", "cartpole"): lambda s: (
        _types(s) == {"cartpole": 1.0}
        # the quick start's update, tuned in the mix (the learner's own: the ppo row below)
        and (s.learner.backlog, s.learner.update_envs, s.learner.minibatch_size, s.learner.epochs)
        == ("sync", 32, 1024, 6)
    ),
    ("env_mix", "classic"): lambda s: _types(s) == CLASSIC,
    ("env_mix", "control"): lambda s: (
        _types(s) == {"cartpole": 1.0, "acrobot": 1.0, "pendulum": 1.0, "lunar_lander": 1.0, "physics_sim": 1.0}
        and next(t for t in s.env_types if t.name == "physics_sim").node["reward_scale"] == 100.0
    ),
    ("env_mix", "gym"): lambda s: _types(s) == {"CartPole-v1": 1.0} and s.env_types[0].node["id"] == "CartPole-v1",
    ("env_mix", "images"): lambda s: _types(s) == {"atari": 1.0, "minigrid": 1.0, "unity_sim": 1.0},
    ("env_mix", "lunar_lander"): lambda s: _types(s) == {"lunar_lander": 1.0},
    ("env_mix", "minigrid"): lambda s: _types(s) == {"minigrid": 1.0} and s.env_types[0].node["view"] == "symbolic",
    ("env_mix", "mixed"): lambda s: _types(s) == {"cartpole": 0.5, "mountaincar_cont": 0.5},
    ("env_mix", "mountaincar_cont"): lambda s: _types(s) == {"mountaincar_cont": 1.0},
    ("env_mix", "pendulum"): lambda s: _types(s) == {"pendulum": 1.0},
    ("env_mix", "reward_scales"): lambda s: _types(s) == {**CLASSIC, "physics_sim": 1.0},
    ("env_mix", "seed12"): lambda s: (
        len(s.env_types) == 12 and {"atari", "bullet_reacher", "minigrid", "web_sim"} <= set(_types(s))
    ),
    ("groups", "default"): lambda s: (
        (s.groups.size_setting, s.groups.hot, s.groups.wake_after_steps, s.groups.cgroup) == ("auto", 2, 100, "auto")
        and s.groups.size == s.layout.group_size
    ),
    ("heartbeat", "default"): lambda s: (
        (s.heartbeat.timeout_s, s.heartbeat.startup_timeout_s, s.heartbeat.scan_interval_s) == (90, 300, 30)
    ),
    ("learner", "ppo"): lambda s: (
        (
            s.learner.mode,
            s.learner.rollout_len,
            s.learner.hidden,
            s.learner.value_norm,
            s.learner.adv_norm,
        )
        == ("ppo", 32, (64, 64), "popart", "per_type")
    ),
    ("logging", "default"): lambda s: (
        (
            s.logging.progress_interval_s,
            s.logging.aggregate_interval_s,
            s.logging.random_return_episodes,
            s.logging.random_return_budget_s,
        )
        == (10, 60, 20, 30)
    ),
    ("eval", "default"): lambda s: (
        (s.eval.interval_s, s.eval.episodes, s.eval.budget_s, s.eval.max_steps) == (None, 5, 20.0, 5000)
    ),
    ("dist", "default"): lambda s: (
        (s.dist.sync_frac, s.dist.backend, s.dist.timeout_s) == (0.6, "auto", 300.0) and s.env_id_offset == 0
    ),
    ("redis", "embedded"): lambda s: s.redis.url is None,
    ("reward_norm", "global"): lambda s: (s.reward_norm.mode, s.reward_norm.clip) == ("global", 10),
    ("reward_norm", "mean_std"): lambda s: (s.reward_norm.mode, s.reward_norm.clip) == ("mean_std", 10),
    ("reward_norm", "off"): lambda s: s.reward_norm.mode == "off",
    ("reward_norm", "per_type"): lambda s: (s.reward_norm.mode, s.reward_norm.sync_every) == ("per_type", 1000),
    ("reward_norm", "per_env"): lambda s: (s.reward_norm.mode, s.reward_norm.sync_every) == ("per_env", 1000),
    ("run", "default"): lambda s: (
        (s.run.duration_s, s.run.total_env_steps, s.run.seed, s.run.resume) == (600, 500000, 1, False)
    ),
    ("scaling", "off"): lambda s: not s.scaling.enabled,
    ("scaling", "on"): lambda s: s.scaling.enabled and s.scaling.window == 100,
    ("worker", "default"): lambda s: (
        (
            s.worker.start_method,
            s.worker.step_timeout_s,
            s.worker.doorbell_timeout_s,
            s.worker.threads,
            s.worker.slices_setting,
            s.worker.affinity_setting,
        )
        == ("forkserver", 30, 1.0, 1, "auto", "auto")
    ),
}


def test_every_group_option_has_a_check():
    assert set(group_options()) == set(OPTION_CHECKS)


@pytest.mark.parametrize("group,option", list(group_options()))
def test_every_group_option_composes_and_validates(group, option):
    overrides = [f"{group}={option}"]
    if group == "env_mix" and option == "gym":
        overrides.append("env_mix.id=CartPole-v1")
    spec = run_spec(compose_cfg(overrides))
    assert OPTION_CHECKS[(group, option)](spec), spec


def test_defaults_are_plain_values():
    spec = run_spec(compose_cfg())
    assert spec.env_types[0].name == "cartpole"
    assert [k.name for k in spec.obs_keys] == ["rgb", "state", "vector"]
    assert spec.redis.url is None
    assert isinstance(spec.learner.hidden, tuple)


@pytest.mark.parametrize(
    "override,key",
    [
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
        ("groups.size=0", "groups.size"),
        ("groups.size=big", "groups.size"),
        ("learner.value_norm=popart_plus", "learner.value_norm"),
        ("learner.adv_norm=per_env", "learner.adv_norm"),
        ("learner.popart_beta=0", "learner.popart_beta"),
        ("learner.popart_beta=2", "learner.popart_beta"),
        ("reward_norm.mode=mean", "reward_norm.mode"),
        ("logging.random_return_episodes=-1", "logging.random_return_episodes"),
        ("eval.episodes=0", "eval.episodes"),
        ("eval.interval_s=-5", "eval.interval_s"),
        ("eval.interval_s=0", "eval.interval_s"),
        ("eval.budget_s=0", "eval.budget_s"),
        ("eval.max_steps=0", "eval.max_steps"),
        ("run.seed=-1", "run.seed"),  # a numpy traceback in the first worker before its check
        ("run.seed=4294967296", "run.seed"),
    ],
)
def test_bad_values_raise_config_error_naming_the_key(override, key):
    overrides = [override] + (["run.total_env_steps=null"] if key == "run.duration_s" else [])
    with pytest.raises(ConfigError) as err:
        run_spec(compose_cfg(overrides))
    assert key in str(err.value)
    assert "allowed" in str(err.value)


@pytest.mark.parametrize("fault", ["kill_redis_at_s", "pause_redis_at_s"])
def test_a_redis_fault_with_an_external_server_is_refused(fault):
    """The Redis faults signal the embedded redis-server: with redis.url set there is none."""
    url = "redis://localhost:6379/0"
    workers_only = run_spec(compose_cfg([f"redis.url={url}", "chaos=on", "chaos.kill_redis_at_s=null"]))
    assert workers_only.chaos.kill_worker_every_s is not None  # the worker faults need no Redis of ours
    assert run_spec(compose_cfg([f"chaos.{fault}=5"])).redis.url is None  # embedded: allowed
    with pytest.raises(ConfigError) as err:
        run_spec(compose_cfg([f"redis.url={url}", f"chaos.{fault}=5"]))
    assert f"chaos.{fault}=5" in str(err.value) and "redis.url" in str(err.value) and "allowed" in str(err.value)


def test_worker_slices_auto_double_buffers_only_few_workers(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr("rlpipe.process_layout.cgroup_cpu_limit", lambda: None)
    slices = {n: run_spec(compose_cfg([f"env_count={n}"])).worker.slices for n in (1, 64, 210, 280, 7000)}
    # PPO trains on CPU 0, so the workers step on one: 1 env: at most the group; one worker: 2;
    # 3 and 4 workers: 1; 7,000: groups of 700 in slices of 70
    assert slices == {1: 1, 64: 2, 210: 1, 280: 1, 7000: 10}
    assert run_spec(compose_cfg(["env_count=7000", "worker.slices=3"])).worker.slices == 3
    explicit = run_spec(compose_cfg(["env_count=7000", "groups.size=70"]))
    assert (explicit.groups.size, explicit.worker.slices, explicit.layout.workers) == (70, 1, 100)


@pytest.mark.parametrize("setting", ["learner_core", "auto"])
def test_learner_core_keeps_one_cpu_for_the_update_when_ppo_trains_here(monkeypatch, setting):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1, 2})
    monkeypatch.setattr("rlpipe.process_layout.cgroup_cpu_limit", lambda: None)
    spec = run_spec(compose_cfg([f"worker.cpu_affinity={setting}"]))
    assert spec.worker.cpu_affinity == (1, 2) and spec.learner_cpu == 0
    assert spec.layout.affinity == "learner_core" and spec.layout.pin_after_startup
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # cuda is valid only where there is one
    for other in (["learner.mode=random"], ["learner.device=cuda"]):  # no update on these CPUs
        spec = run_spec(compose_cfg([f"worker.cpu_affinity={setting}", *other]))
        assert spec.worker.cpu_affinity is None and spec.learner_cpu is None
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0})
    spec = run_spec(compose_cfg([f"worker.cpu_affinity={setting}"]))  # one CPU: nothing to keep
    assert spec.worker.cpu_affinity is None and spec.learner_cpu is None
    assert run_spec(compose_cfg(["worker.cpu_affinity=null"])).learner_cpu is None
    with pytest.raises(ConfigError, match="learner_core"):
        run_spec(compose_cfg(["worker.cpu_affinity=learner"]))


def test_cpu_affinity_auto_is_the_default_and_a_list_pins_from_the_start(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr("rlpipe.process_layout.cgroup_cpu_limit", lambda: None)
    spec = run_spec(compose_cfg())
    assert spec.worker.affinity_setting == "auto" and spec.learner_cpu == 0
    listed = run_spec(compose_cfg(["worker.cpu_affinity=[1]"]))
    assert listed.worker.cpu_affinity == (1,) and listed.learner_cpu is None
    assert not listed.layout.pin_after_startup
    # a quota below two CPUs: auto keeps every CPU for the workers, learner_core still pins
    monkeypatch.setattr("rlpipe.process_layout.cgroup_cpu_limit", lambda: 1.5)
    assert run_spec(compose_cfg()).learner_cpu is None
    assert run_spec(compose_cfg(["worker.cpu_affinity=learner_core"])).learner_cpu == 0


def test_cli_bad_value_is_one_paragraph_no_traceback(short_tmp):
    out = run_cli(short_tmp / "run", "env_count=0", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "env_count=0" in out.stderr and "positive integer" in out.stderr
    assert not (short_tmp / "run" / "summary.json").exists()


def test_cli_unknown_group_option_lists_what_is_allowed(short_tmp):
    out = run_cli(short_tmp / "run", "buffer=huge", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "no option `huge` in config group `buffer`" in out.stderr and "state_only" in out.stderr


def test_cli_wrong_type_is_clear(short_tmp):
    out = run_cli(short_tmp / "run", "env_count=many", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "env_count" in out.stderr


def test_env_type_that_does_not_fit_the_buffer(short_tmp):
    # an explicit buffer is used as written (the default, buffer=auto, would grow to fit)
    out = run_cli(short_tmp / "run", "buffer=small", "buffer.keys.state.shape=[2]", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "buffer.keys.state.shape" in out.stderr and "cartpole" in out.stderr


def test_conf_dir_is_the_repository_one():
    assert conf_dir() == REPO / "conf"


STAGES = sorted(p.stem for p in (conf_dir() / "stage").glob("day*.yaml"))


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_composes_and_validates(stage):
    """Each stage's own numbers reach the spec (read from its yaml, against the defaults)."""
    from omegaconf import OmegaConf

    own = OmegaConf.load(conf_dir() / "stage" / f"{stage}.yaml")
    default = run_spec(compose_cfg())
    spec = run_spec(compose_cfg([f"+stage={stage}"]))
    assert spec.stage == stage
    assert spec.env_count == own.get("env_count", default.env_count)
    run = own.get("run", {})
    assert spec.run.mode == run.get("mode", "train")
    assert spec.run.duration_s == run.get("duration_s", default.run.duration_s)
    assert spec.run.total_env_steps == run.get("total_env_steps", default.run.total_env_steps)
    for key, value in own.get("groups", {}).items():
        assert getattr(spec.groups, key) == value, key
    for key, value in own.get("heartbeat", {}).items():
        assert getattr(spec.heartbeat, key) == value, key
    for key, value in own.get("eval", {}).items():
        assert getattr(spec.eval, key) == value, key
    for key, value in own.get("learner", {}).items():
        got = getattr(spec.learner, key)
        assert (tuple(got) if isinstance(got, (list, tuple)) else got) == (
            tuple(value) if OmegaConf.is_list(value) else value
        ), key


def test_stage_env_count_is_overridable_and_day4_is_the_seed12_mix():
    spec = run_spec(compose_cfg(["+stage=day4", "env_count=1234"]))
    assert spec.env_count == 1234
    assert len(spec.env_types) == 12
    # a stage's tuning of types outside the mix is left out, not an error
    assert [t.name for t in run_spec(compose_cfg(["+stage=day5", "env_mix=cartpole"])).env_types] == ["cartpole"]


def test_day5_composes_to_its_chaos_schedule_and_tightened_heartbeats():
    """What +stage=day5 runs with, written out: the stage states only what differs from the
    options it picks (its fault schedule is chaos=on's), and this pins the composed values."""
    from omegaconf import OmegaConf

    cfg = compose_cfg(["+stage=day5"])
    got = {k: OmegaConf.to_container(cfg[k]) for k in ("chaos", "heartbeat", "groups", "buffer")}
    # the faults it turns on; every other fault's setting stays off (null)
    got["chaos"] = {k: v for k, v in got["chaos"].items() if v is not None}
    assert got == {
        "chaos": {"kill_worker_every_s": 30.0, "stop_worker_every_s": 45.0, "kill_redis_at_s": 20.0},
        "heartbeat": {
            "signal_interval_s": 0.5,
            "redis_interval_s": 1.0,
            "scan_interval_s": 2.0,
            "timeout_s": 10.0,
            "term_grace_s": 2.0,
            "startup_timeout_s": 300.0,
        },
        "groups": {
            "size": "auto",
            "hot": 4,
            "wake_after_steps": 20,
            "wake_batch": 4,
            "wake_growth": 2.0,
            "cgroup": "auto",
            "dormant_cpu_pct": 1.0,
            "dormant_mem_mb": 512,
            "active_mem_mb": "auto",
        },
        "buffer": {
            "sync": "seqlock",
            "sizing": "fixed",
            "keys": {
                "rgb": {"shape": [64, 64, 3], "dtype": "uint8"},
                "state": {"shape": [32], "dtype": "float32"},
                "vector": {"shape": [16], "dtype": "float32"},
            },
        },
    }
    assert all(type(v) is float for v in got["chaos"].values())
    assert (
        cfg.stage,
        cfg.env_count,
        cfg.worker.step_timeout_s,
        cfg.logging.aggregate_interval_s,
        cfg.learner.update_envs,
        cfg.learner.minibatch_size,
        cfg.run.duration_s,
        cfg.run.total_env_steps,
    ) == ("day5", 1000, 2.0, 15.0, 256, 2048, 180.0, None)
    assert list(cfg.env_mix.weights) == [
        "cartpole",
        "acrobot",
        "pendulum",
        "mountaincar_cont",
        "lunar_lander",
        "bullet_reacher",
        "atari",
        "minigrid",
        "unity_sim",
        "physics_sim",
        "web_sim",
        "faulty",
    ]
    faulty, web = cfg.env_mix.types.faulty, cfg.env_mix.types.web_sim
    assert (faulty.reset_error_rate, faulty.step_error_rate, faulty.render_error_rate, faulty.violation_rate) == (
        0.05,
        0.01,
        0.002,
        0.002,
    )
    assert (web.hang_rate, web.hang_s, web.hang_raises) == (0.002, None, False)


def test_over_budget_config_is_refused_with_the_arithmetic(short_tmp):
    out = run_cli(
        short_tmp / "run",
        "+stage=day4",
        "buffer=seed",
        "env_mix.types.minigrid.view=rgb",  # seed's vector (64) is too short for day4's symbolic MiniGrid
        "learner.rollout_len=64",
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "rollout storage env_count 7000 x learner.rollout_len 64" in out.stderr
    assert "GiB usable here" in out.stderr
    assert not (short_tmp / "run" / "summary.json").exists()


def test_a_config_saved_by_an_older_rlpipe_reads_back_with_todays_defaults_for_newer_keys(tmp_path):
    """rlpipe.eval and rlpipe.report read a run's .hydra/config.yaml: a run saved before the
    eval group and the resource settings existed still loads, those keys at conf/'s defaults."""
    from omegaconf import OmegaConf

    from rlpipe.config import run_spec

    saved = OmegaConf.to_container(compose_cfg(["env_count=16"]), resolve=False)
    del saved["eval"], saved["logging"]["resources_interval_s"], saved["logging"]["project_to_s"]
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(saved)))
    spec = run_spec(OmegaConf.load(path))
    assert spec.env_count == 16
    assert spec.eval.interval_s is None and spec.eval.episodes == 5
    assert spec.logging.resources_interval_s == 1.0 and spec.logging.project_to_s == 518400.0
