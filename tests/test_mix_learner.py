"""The learner settings that follow the mix (rlpipe/mix_learner.py): `auto` rollout_len and
update_envs resolved from the composed config, a number kept as it is, and what was chosen
said in the run's log line and summary.json."""

from __future__ import annotations

import pytest

from conftest import compose_cfg, read_summary
from rlpipe.config import ConfigError, run_spec

# The case: a long-horizon type (LunarLander, whose node asks for 128 steps) beside two
# short-horizon types, 64 envs each, composed on the command line.
THREE = [
    "env_mix=lunar_lander",
    "+env@env_mix.types.cartpole=cartpole",
    "+env@env_mix.types.acrobot=acrobot",
    "+env_mix.weights.cartpole=1",
    "+env_mix.weights.acrobot=1",
    "env_count=192",
]


def shape(overrides: list[str]) -> tuple[tuple[int, int, int], dict]:
    spec = run_spec(compose_cfg(overrides))
    lc = spec.learner
    return (lc.rollout_len, lc.update_envs, lc.minibatch_size), spec.learner_from


def test_a_composed_mix_gets_each_types_share_of_a_specialists_update():
    (rollout, update, minibatch), how = shape(THREE)
    assert (rollout, update, minibatch) == (128, 192, 512)
    assert "lunar_lander's env node" in how["rollout_len"]
    assert how["update_envs"] == "auto: 64 x 3 (the mix's weights / lunar_lander's)"
    assert how["minibatch_size"] == "set"  # 512 whatever the mix: more gradient steps, not larger ones


def test_a_type_alone_keeps_the_learners_old_numbers():
    # the specialists' update as before (64 env-rollouts, minibatches of 512), the rollout its node's
    assert shape(["env_mix=acrobot"])[0] == (32, 64, 512)
    assert shape(["env_mix=lunar_lander"])[0] == (128, 64, 512)
    assert shape(["env_mix=pendulum", "env_count=16"])[0] == (32, 16, 512)  # capped by env_count


def test_the_quick_start_and_day4_keep_their_own_settings():
    (rollout, update, minibatch), how = shape([])  # env_mix=cartpole: the quick start
    assert (rollout, update, minibatch) == (32, 32, 1024)
    assert how["update_envs"] == how["minibatch_size"] == "set"
    day4, how = shape(["+stage=day4"])
    assert day4 == (16, 512, 2048) and set(how.values()) == {"set"}


def test_a_mix_composed_on_the_quick_starts_file_gets_the_learners_own_update():
    """conf/env_mix/cartpole.yaml tunes the update to CartPole alone (`${alone:...}`): a type
    added to it gets the learner's defaults and the mix's `auto`s, as from any other file;
    the command line still overrules both."""
    acrobot = ["+env@env_mix.types.acrobot=acrobot", "+env_mix.weights.acrobot=1", "env_count=128"]
    spec = run_spec(compose_cfg(acrobot))
    lc = spec.learner
    assert (lc.backlog, lc.epochs, lc.learning_rate, lc.clip_vloss) == ("hold", 4, 1.0e-3, True)
    assert (lc.rollout_len, lc.update_envs, lc.minibatch_size) == (32, 128, 512)
    assert spec.learner_from["update_envs"].startswith("auto: 64 x 2")
    alone = run_spec(compose_cfg([])).learner
    assert (alone.backlog, alone.epochs, alone.learning_rate, alone.clip_vloss) == ("sync", 6, 5.0e-3, False)
    assert run_spec(compose_cfg([*acrobot, "learner.epochs=3"])).learner.epochs == 3
    swapped = ["~env_mix.types.cartpole", "~env_mix.weights.cartpole", *acrobot]  # one type, not CartPole
    assert run_spec(compose_cfg(swapped)).learner.backlog == "hold"


def test_a_number_wins_and_shared_type_settings_leave_out_the_nodes_rollouts():
    assert shape([*THREE, "learner.rollout_len=64", "learner.update_envs=100"])[0] == (64, 100, 512)
    assert shape([*THREE, "learner.type_settings=shared"])[0] == (32, 192, 512)
    assert shape([*THREE, "learner.type_rollout_len=256"])[0][0] == 256  # no type asks for more
    assert shape([*THREE, "learner.update_envs_per_type=16"])[0][1] == 48
    assert shape([*THREE, "env_count=100"])[0][1] == 100  # every env, no more
    how = shape([*THREE, "env_count=100"])[1]["update_envs"]
    assert how == "auto: 64 x 3 (the mix's weights / lunar_lander's) (capped by env_count)"


def test_the_type_with_the_most_envs_gets_as_many_updates_as_alone():
    # LunarLander on twice the envs of the others: 64 of its env-rollouts an update, the rest in proportion
    (_, update, _), how = shape([*THREE, "env_count=256", "env_mix.weights.lunar_lander=2"])
    assert update == 128 and how["update_envs"] == "auto: 64 x 2 (the mix's weights / lunar_lander's)"


@pytest.mark.parametrize(
    "override, key",
    [
        ("learner.rollout_len=0", "learner.rollout_len"),
        ("learner.update_envs=many", "learner.update_envs"),
        ("learner.update_envs_per_type=0", "learner.update_envs_per_type"),
        ("+env_mix.types.cartpole.learner.rollout_len=auto", "env_mix.types.cartpole.learner.rollout_len"),
        ("+env_mix.types.cartpole.learner.epochs=3", "env_mix.types.cartpole.learner.epochs"),
    ],
)
def test_a_bad_value_is_one_paragraph_naming_its_key(override, key):
    with pytest.raises(ConfigError) as err:
        run_spec(compose_cfg([*THREE, override]))
    assert f"{key}=" in str(err.value) and "\n" not in str(err.value)


def test_the_run_says_what_it_resolved(cartpole_multirun):
    run_dir = cartpole_multirun / "0"  # 16 CartPoles under env_mix=cartpole (tests/conftest.py)
    learner = read_summary(run_dir)["learner"]
    assert {k: learner[k] for k in ("rollout_len", "update_envs", "minibatch_size")} == {
        "rollout_len": 32,
        "update_envs": 32,
        "minibatch_size": 1024,
    }
    assert learner["from"]["rollout_len"].startswith("auto: learner.type_rollout_len")
    assert learner["from"]["update_envs"] == "set"
    log = (run_dir / "app.log").read_text()
    assert "learner: rollout_len 32 (auto: learner.type_rollout_len" in log
