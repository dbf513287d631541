"""benchmarks/multitask.py: a type's own envs and budget, the generalist's weights that give
each type exactly its envs, and a specialist that takes no override of a type it does not run."""

from __future__ import annotations

import pytest

from conftest import compose_cfg, load_benchmark
from rlpipe.config import run_spec
from rlpipe.envs.registry import plan_mix

multitask = load_benchmark("multitask")
MIXED = ["cartpole", "mountaincar_cont"]  # env_mix=mixed, in its order


def test_envs_of_gives_a_type_its_own_envs_and_names_a_bad_item():
    assert multitask.envs_per_type(MIXED, 32, ["mountaincar_cont=96"]) == {"cartpole": 32, "mountaincar_cont": 96}
    for bad in ("pendulum=8", "cartpole=0", "cartpole", "cartpole=x"):
        with pytest.raises(SystemExit, match=r"--envs-of .*cartpole, mountaincar_cont"):
            multitask.envs_per_type(MIXED, 32, [bad])


def test_the_generalist_runs_each_type_on_its_own_envs_and_budget():
    counts = {"cartpole": 8, "mountaincar_cont": 24}
    overrides = multitask.generalist_overrides("mixed", counts, 4096, seed=3)
    spec = run_spec(compose_cfg(overrides))
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    assert plan.counts() == counts
    assert spec.run.total_env_steps == 32 * 4096
    assert spec.learner.update_envs == 32
    assert spec.learner.minibatch_size == 2 * multitask.BASE_MINIBATCH
    smaller = multitask.generalist_overrides("mixed", counts, 4096, seed=3, minibatch=256)  # --generalist-minibatch
    assert run_spec(compose_cfg(smaller)).learner.minibatch_size == 256


def test_defaults_leave_the_update_to_the_learners_auto_settings():
    counts = {"cartpole": 64, "mountaincar_cont": 128}
    overrides = multitask.generalist_overrides("mixed", counts, 4096, seed=3, defaults=True)
    assert not [o for o in overrides if o.startswith("learner.")]
    spec = run_spec(compose_cfg(overrides))
    assert spec.learner.update_envs == 96  # auto: 64 x the weights' sum / the largest (64 x 192 / 128)
    assert spec.learner.minibatch_size == multitask.BASE_MINIBATCH


def test_a_specialist_leaves_out_the_overrides_of_types_not_in_its_run():
    given = [
        "env_mix.types.minigrid.view=symbolic",
        "+env_mix.types.cartpole.learner.gamma=0.9",
        "~env_mix.weights.minigrid",
        "learner.epochs=2",
    ]
    names = ["cartpole", "minigrid"]
    assert multitask.only_for("cartpole", names, given) == [given[1], given[3]]
    assert multitask.only_for("minigrid", names, given) == [given[0], given[2], given[3]]


def test_random_returns_are_played_on_the_nodes_the_runs_train_on():
    nodes = multitask.mix_types("seed12", ["env_mix.types.minigrid.view=symbolic"])
    assert len(nodes) == 12 and nodes["minigrid"]["view"] == "symbolic"
    assert multitask.mix_types("seed12", [])["minigrid"]["view"] == "rgb"


random_mixes = load_benchmark("random_mixes")


def test_random_mixes_are_drawn_by_the_seed_alone():
    mixes = random_mixes.draw_mixes(20, seed=5)
    assert mixes == random_mixes.draw_mixes(20, seed=5) != random_mixes.draw_mixes(20, seed=6)
    assert all(2 <= len(m) <= 4 and len(set(m)) == len(m) and set(m) <= set(random_mixes.POOL) for m in mixes)
    assert {len(m) for m in mixes} == {2, 3, 4}


def test_a_random_mix_is_composed_as_a_user_would_with_each_type_at_its_budget():
    types = ["cartpole", "lunar_lander", "minigrid"]
    steps = random_mixes.budgets(types, 0.5)
    overrides, envs = random_mixes.generalist_overrides(types, steps, seed=2)
    assert not [o for o in overrides if o.startswith("learner.")]  # defaults only
    assert overrides[0] == "env_mix=lunar_lander"  # not env_mix=cartpole: it tunes the update to CartPole
    spec = run_spec(compose_cfg(overrides))
    plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    assert plan.counts() == envs == {"cartpole": 64, "lunar_lander": 128, "minigrid": 64}
    # every env steps equally often: type t makes its own budget
    per_env = spec.run.total_env_steps / spec.env_count
    assert {t: round(per_env * n) for t, n in envs.items()} == steps
    assert next(t for t in spec.env_types if t.name == "minigrid").node["view"] == "symbolic"  # its env_mix's
    lc = spec.learner
    # auto, from the mix: 64 env-rollouts of LunarLander (the type with the most envs), the rest in proportion
    assert (lc.rollout_len, lc.update_envs, lc.minibatch_size) == (128, 128, 512)
    alone = run_spec(compose_cfg(random_mixes.specialist_overrides("minigrid", 250_000, seed=2)))
    assert alone.env_count == 64 and alone.env_types[0].node["view"] == "symbolic"
