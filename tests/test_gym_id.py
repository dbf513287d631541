"""Any Gymnasium id just works (issue 28): the default board (buffer=auto) grows to the mix's
obs at plan time, an explicit buffer is used as written, every stage and mix keeps the board it
had, and an env_mix=gym type is named after its id (or env_mix.name) wherever a type name
appears. The third-party env is tests/wide_obs_gym.py, registered on import (no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

import wide_obs_gym
from conftest import REPO, compose_cfg, driver_dies_with_pytest, read_summary, rlpipe_cmd, run_cli
from rlpipe.config import ConfigError, conf_dir, run_spec
from rlpipe.config_checks import id_type_name
from rlpipe.envs.registry import plan_mix
from rlpipe.learner.backlog import DROP_KEEPS_BATCHES
from rlpipe.learner.budget import check_memory_budget
from rlpipe.learner.rollout_store import RolloutStore
from rlpipe.supervisor.workers import group_ranges

WIDE_ID = "wide_obs_gym:WideObs-v0"
WIDE = ["env_mix=gym", f"env_mix.id={WIDE_ID}"]
STAGES = [None] + sorted(p.stem for p in (conf_dir() / "stage").glob("day*.yaml"))
MIXES = sorted(p.stem for p in (conf_dir() / "env_mix").glob("*.yaml"))
# Mixes that came after buffer=auto and need it: no board of buffer=small to keep (minigrid's
# specialist runs the symbolic view, 147 numbers on `vector`, which small's 16 cannot hold).
AUTO_ONLY_MIXES = {"minigrid"}


def _plan(overrides: list[str]):
    spec = run_spec(compose_cfg(overrides))
    return spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)


def _board(plan) -> dict:
    return {k.name: (k.shape, k.dtype) for k in plan.obs_keys}


# --- the board sized from the mix ---------------------------------------------------------------


def test_default_board_grows_to_a_wide_gym_obs_and_an_explicit_buffer_keeps_its_error():
    spec, plan = _plan(WIDE)
    assert spec.buffer.sizing == "auto"
    assert _board(plan) == {"state": ((wide_obs_gym.OBS_DIM,), "float32")}
    # an explicit buffer is used as written: today's error, naming the key and both lengths
    with pytest.raises(
        ConfigError,
        match=f"produces state of {wide_obs_gym.OBS_DIM} values but "
        r"buffer.keys.state.shape holds 32",
    ):
        _plan(WIDE + ["buffer=small"])


def test_memory_check_counts_the_sized_board():
    spec, plan = _plan(WIDE + ["env_count=64"])
    budget = check_memory_budget(spec, plan, group_ranges(spec.env_count, spec.groups.size))
    assert budget["obs_bytes_per_step"] == wide_obs_gym.OBS_DIM * 4
    with pytest.raises(ConfigError) as err:  # a machine too small: the arithmetic shows it
        check_memory_budget(spec, plan, group_ranges(spec.env_count, spec.groups.size), total_bytes=2**20)
    msg = str(err.value)
    assert f"{wide_obs_gym.OBS_DIM * 4:,} B of obs per step (state [{wide_obs_gym.OBS_DIM}] float32" in msg
    assert "buffer=auto" in msg


def test_memory_check_counts_the_batches_drop_keeps_waiting():
    """Under learner.backlog=drop up to DROP_KEEPS_BATCHES batches wait while an update trains,
    and less than a block beyond them; under hold the next batch and one round's completions."""
    budgets = {}
    for backlog in ("hold", "drop"):
        spec, plan = _plan(WIDE + ["env_count=64", f"learner.backlog={backlog}"])
        budgets[backlog] = check_memory_budget(spec, plan, group_ranges(spec.env_count, spec.groups.size))
    assert budgets["drop"]["ready_blocks"] > budgets["hold"]["ready_blocks"]  # it keeps more waiting
    per_batch = budgets["hold"]["ready_blocks"] / 2  # bytes, truncated to an int on each side
    assert abs(budgets["drop"]["ready_blocks"] - per_batch * (DROP_KEEPS_BATCHES + 1)) <= DROP_KEEPS_BATCHES + 1
    assert budgets["drop"]["rollouts"] == budgets["hold"]["rollouts"]


def test_memory_check_counts_the_rollouts_the_store_keeps():
    """An obs key only some types produce (seed12's rgb) is counted for those envs alone, as
    the rollout store allocates it: the budget's rollouts are the store's bytes."""
    spec, plan = _plan(["env_mix=seed12", "env_count=96", "learner.rollout_len=16"])
    budget = check_memory_budget(spec, plan, group_ranges(spec.env_count, spec.groups.size))
    n_types = len(plan.specs)
    store = RolloutStore(plan, 16, 4, np.full(n_types, 0.99), np.full(n_types, 0.95), weighted=True)
    arrays = [*store.obs.values(), store.a_disc, store.a_cont, store.logp, store.value]
    arrays += [store.reward, store.done, store.weight]
    assert budget["rollouts"] == sum(a.nbytes for a in arrays)
    every_key = 16 * spec.env_count * budget["obs_bytes_per_step"]
    assert budget["rollouts"] < every_key / 2  # rgb is most of a step's bytes, and few types have it


def test_sized_rgb_is_the_types_own_shape_when_they_agree():
    # a gym image type told to keep its native frame: the board takes that frame
    spec, plan = _plan(["env_mix=gym", "env_mix.id=ALE/Pong-v5", "env_mix.types.gym.rgb_shape=null"])
    assert _board(plan)["rgb"] == ((210, 160, 3), "uint8")
    assert spec.env_types[0].name == "Pong-v5"
    # types that disagree: the configured (buffer=small's) shape, and the odd one is named
    with pytest.raises(
        ConfigError,
        match=r"'atari' renders rgb \[210, 160, 3\] but buffer.keys.rgb.shape "
        r"is \[64, 64, 3\]",
    ):
        _plan(["env_mix=images", "env_mix.types.atari.rgb_shape=null"])


def test_a_run_config_saved_before_buffer_sizing_reads_back_as_fixed():
    saved = OmegaConf.create(OmegaConf.to_yaml(compose_cfg(["buffer=small"])))  # as .hydra/config.yaml
    del saved.buffer["sizing"]
    assert run_spec(saved).buffer.sizing == "fixed"
    assert run_spec(OmegaConf.create(OmegaConf.to_yaml(compose_cfg()))).buffer.sizing == "auto"


def _stage_buffer(stage: str | None) -> str | None:
    """The buffer a stage picks itself (`override /buffer: X` in its defaults), else None."""
    if stage is None:
        return None
    own = OmegaConf.load(conf_dir() / "stage" / f"{stage}.yaml")
    picks = [d["override /buffer"] for d in own.get("defaults", []) if "override /buffer" in d]
    return picks[0] if picks else None


def _check_board_unchanged(stage: str | None, mix: str | None) -> None:
    """Before buffer=auto the default was buffer=small: a config that took the default must plan
    exactly that board now (so no figure moves), and a stage that picks its buffer keeps it."""
    picked = _stage_buffer(stage)
    overrides = (
        ([f"+stage={stage}"] if stage else [])
        + ([f"env_mix={mix}"] if mix else [])
        + (["env_mix.id=CartPole-v1"] if mix == "gym" else [])
    )
    spec, plan = _plan(overrides)
    assert spec.buffer.sizing == ("auto" if picked in (None, "auto") else "fixed"), overrides
    if picked == "auto":  # the stage lets its board grow on purpose: its own test below says how
        return
    _, before = _plan(overrides + [f"buffer={picked or 'small'}"])
    assert plan.obs_keys == before.obs_keys, (overrides, _board(plan), _board(before))


# Every mix on the default board, and every stage with its own mix (a stage changes the board
# only through the buffer it picks and the type parameters it sets for its mix) ...
@pytest.mark.parametrize(
    "stage,mix",
    [(None, m) for m in MIXES if m not in AUTO_ONLY_MIXES] + [(s, None) for s in STAGES if s],
    ids=lambda v: v or "-",
)
def test_every_stage_and_mix_composes_to_the_board_it_had(stage, mix):
    _check_board_unchanged(stage, mix)


def test_day4_plans_small_s_board_with_vector_grown_to_minigrid_s_symbolic_grid():
    """day4 picks buffer=auto for MiniGrid's symbolic view: small's keys, vector 147 long."""
    _, plan = _plan(["+stage=day4"])
    _, small = _plan(["+stage=day4", "buffer=small", "env_mix.types.minigrid.view=rgb"])
    grown = {k.name: (k.shape, k.dtype) for k in small.obs_keys} | {"vector": ((147,), "float32")}
    assert {k.name: (k.shape, k.dtype) for k in plan.obs_keys} == grown


# ... and, to be sure, every stage with every mix (two Hydra compositions a pair: minutes).
@pytest.mark.slow
@pytest.mark.parametrize("stage", [s for s in STAGES if s])
def test_every_stage_with_every_mix_composes_to_the_board_it_had(stage):
    for mix in MIXES:
        if mix not in AUTO_ONLY_MIXES:
            _check_board_unchanged(stage, mix)


# --- the type named after its id ------------------------------------------------------------------


@pytest.mark.parametrize(
    "gym_id,name",
    [
        ("flappy_bird_gymnasium:FlappyBird-v0", "FlappyBird-v0"),  # the module that registers it is left out
        ("ALE/Pong-v5", "Pong-v5"),  # so is the namespace: '/' nests tags and paths
        ("MiniGrid-DoorKey-5x5-v0", "MiniGrid-DoorKey-5x5-v0"),
    ],
)
def test_id_type_name(gym_id, name):
    assert id_type_name(gym_id) == name


def test_gym_type_is_named_after_the_id_or_env_mix_name():
    spec = run_spec(compose_cfg(WIDE))
    (t,) = spec.env_types
    assert (t.name, t.conf_path) == ("WideObs-v0", "env_mix.types.gym")
    assert [t.name for t in run_spec(compose_cfg(WIDE + ["env_mix.name=wide_2.v1"])).env_types] == ["wide_2.v1"]
    # other mixes keep their names; env_mix.id does not rename a type that does not run it
    assert [t.name for t in run_spec(compose_cfg(["env_mix=mixed", "env_mix.id=Acrobot-v1"])).env_types] == [
        "cartpole",
        "mountaincar_cont",
    ]


@pytest.mark.parametrize(
    "overrides,allowed",
    [
        (WIDE + ["env_mix.name=wide/obs"], "letters, digits"),  # '/' would nest tags and paths
        (WIDE + ["env_mix.name=2wide"], "starts with a letter"),
        (WIDE + ["env_mix.name='wide obs'"], "letters, digits"),
        (WIDE + ["env_mix.name='w,o'"], "letters, digits"),  # ',' would split rlpipe.eval --types
        (WIDE + ["env_mix.name=" + "w" * 65], "1 to 64"),
        (["env_mix=cartpole", "env_mix.name=mine"], "only with a Gymnasium id"),
    ],
)
def test_bad_env_mix_name_is_a_config_error_naming_the_key(overrides, allowed):
    with pytest.raises(ConfigError) as err:
        run_spec(compose_cfg(overrides))
    msg = str(err.value)
    assert msg.startswith("Invalid config value env_mix.name=") and allowed in msg and "\n" not in msg


def test_cli_bad_env_mix_name_is_one_paragraph_exit_2(short_tmp):
    out = run_cli(short_tmp / "run", "env_mix=gym", "env_mix.id=CartPole-v1", "env_mix.name=Cart/Pole", timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if "env_mix.name" in line]
    assert len(lines) == 1 and "'Cart/Pole'" in lines[0] and "allowed is a name" in lines[0]
    assert not (short_tmp / "run" / "summary.json").exists()


# --- a whole run, then the after-the-run CLIs ---------------------------------------------------------


def test_wide_gym_id_trains_on_the_default_board_and_every_output_names_it(short_tmp):
    """The issue's command with a registered test env: no buffer override, the type named
    `WideObs-v0` in summary.json, TensorBoard, the health report, rlpipe.eval and
    rlpipe.report. Its paying cue sits past the 32 floats of buffer=small, so learning it
    shows the policy reads the grown board."""
    run_dir = short_tmp / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}  # the driver and its workers import it
    res = subprocess.run(
        rlpipe_cmd(run_dir, *WIDE, "env_count=16", "run.total_env_steps=30000"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=driver_dies_with_pytest,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    name = "WideObs-v0"
    s = read_summary(run_dir)
    assert s["env_types"] == {name: 16}
    assert set(s["mean_return_last100"]) == set(s["random_return"]) == set(s["env_versions"]) == {name}
    assert s["learned"] == {name: "learned"}, (s["mean_return_last100"], s["random_return"])

    from rlpipe.telemetry.tb_events import read_scalars

    tags = read_scalars(run_dir / "tb")
    assert f"charts/episodic_return/{name}" in tags and f"latency/step_ms/{name}/p50" in tags
    assert f"| {name} | 16 |" in (run_dir / "health_report.md").read_text()

    res = subprocess.run(
        [sys.executable, "-m", "rlpipe.eval", str(run_dir), "--episodes", "2", "--types", name],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    returns = json.loads((run_dir / "eval" / "returns.json").read_text())
    assert list(returns["types"]) == [name]
    assert f"| {name} |" in (run_dir / "eval" / "returns.md").read_text()

    (run_dir / "health_report.md").unlink()
    res = subprocess.run(
        [sys.executable, "-m", "rlpipe.report", str(run_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"| {name} | 16 |" in (run_dir / "health_report.md").read_text()
