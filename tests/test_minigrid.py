"""MiniGrid's two views (rlpipe/envs/minigrid.py): rgb (the default) and MiniGrid's own
symbolic 7x7x3 grid as 147 floats on a flat key, sized onto the board by buffer=auto."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_cfg
from rlpipe.config import ConfigError, run_spec
from rlpipe.envs import check_fits, check_obs, check_step, describe, make_factory, plan_mix
from rlpipe.envs.classic import make_gym


def _spec(*overrides: str):
    return run_spec(compose_cfg(["env_mix=images", *overrides]))


def _minigrid_node(spec) -> dict:
    return next(t for t in spec.env_types if t.name == "minigrid").node


def test_rgb_is_the_default_view():
    spec = _spec()
    assert _minigrid_node(spec)["view"] == "rgb"
    assert describe(_minigrid_node(spec)).obs == {"rgb": ((64, 64, 3), "uint8")}


@pytest.mark.parametrize("key", ["vector", "state"])
def test_symbolic_view_is_minigrids_own_grid_on_a_flat_key(key):
    """147 floats, the env's own `image` observation (object, colour, state per tile) in
    row-major order, stepping under the contract checker."""
    spec = _spec("env_mix.types.minigrid.view=symbolic", f"env_mix.types.minigrid.symbolic_key={key}")
    node = _minigrid_node(spec)
    env_spec = describe(node)
    assert env_spec.obs == {key: ((147,), "float32")}
    env = make_factory(node)(env_id=0, seed=5)
    raw = make_gym(node["id"])
    try:
        obs = env.reset(0)
        check_obs(env_spec, obs)
        raw_obs, _ = raw.reset(seed=5)
        np.testing.assert_array_equal(obs[key], raw_obs["image"].reshape(-1).astype(np.float32))
        rng = np.random.default_rng(0)
        for _ in range(40):
            action = np.asarray(np.int64(rng.integers(env_spec.action_n)))
            out = check_step(env_spec, env.step(0, action))
            raw_obs, *_ = raw.step(int(action))
            np.testing.assert_array_equal(out[0][key], raw_obs["image"].reshape(-1).astype(np.float32))
            if out[2] or out[3]:
                break
    finally:
        env.close(0)
        raw.close()


def test_buffer_auto_sizes_the_symbolic_row_and_a_fixed_board_names_what_does_not_fit():
    spec = _spec("env_mix.types.minigrid.view=symbolic")  # buffer=auto, the default
    plan = plan_mix(spec.env_types, 6, spec.obs_keys, spec.buffer.sizing)
    keys = {k.name: k.shape for k in plan.obs_keys}
    assert keys["vector"] == (147,) and keys["rgb"] == (64, 64, 3)  # atari and unity_sim keep rgb
    for t, s in zip(spec.env_types, plan.specs):
        check_fits(t.name, s, plan.obs_keys)
    small = _spec("env_mix.types.minigrid.view=symbolic", "buffer=small")  # vector 16, as written
    with pytest.raises(ConfigError, match="minigrid") as err:
        plan_mix(small.env_types, 6, small.obs_keys, small.buffer.sizing)
    assert "buffer.keys.vector.shape holds 16" in str(err.value) and "buffer=auto" in str(err.value)


def test_an_unknown_view_or_key_is_refused_naming_the_type():
    for override in ("env_mix.types.minigrid.view=ascii", "env_mix.types.minigrid.symbolic_key=rgb"):
        spec = _spec("env_mix.types.minigrid.view=symbolic", override)
        with pytest.raises(ConfigError, match="minigrid"):
            plan_mix(spec.env_types, 6, spec.obs_keys, spec.buffer.sizing)
