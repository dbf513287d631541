"""The learner settings that only make sense relative to the mix, resolved from it: `auto` for
`learner.rollout_len` and `learner.update_envs`.

A specialist (one type, 64 envs) trains on updates of 64 env-rollouts. A mix of k types run on
the same update gives each type a k-th of them, and one rollout length for all, however long
a horizon a type's discount needs. `auto` keeps each type's share of an update what it is
alone, and the rollout as long as the longest-horizon type of the mix asks for
(docs/multitask.md, "Settings that follow the mix", where the ablation behind each rule is):

- rollout_len:    the longest any type asks for on its env node (`learner.rollout_len` there:
                  LunarLander's 0.999 discount wants 128 steps before GAE bootstraps), else
                  `learner.type_rollout_len`. One value for the run: the rollout store keeps
                  one [T, envs] block per slice, and a slice mixes types.
- update_envs:    `learner.update_envs_per_type` env-rollouts for the type with the most envs,
                  the update's other env-rollouts in the mix's proportions: 64 x sum(weights) /
                  max(weight), at most env_count (64 x k for k types of equal weight). So no type
                  gets fewer PPO updates for its samples than it would alone on 64 envs (a
                  fixed 64 x k gave a type with twice the envs of the others two thirds of
                  them, and LunarLander three quarters of its specialist's return).

`learner.minibatch_size` stays a number (512): minibatches grown with the mix (k x 512, a
specialist's samples of each type in each gradient step) cost LunarLander half its return in
the ablation, where the same update cut into minibatches of 512 (k times the gradient steps)
did not. A value set as a number (a stage, an env_mix option such as the quick start's
`env_mix=cartpole`, the command line) is used as it is. `learner.type_settings=shared` (the
ablation that turns every env node's `learner:` off) also leaves out the nodes' rollouts.

An env_mix file of one type may tune the update to that type alone (the quick start's
conf/env_mix/cartpole.yaml: on-policy, six epochs over one minibatch, a larger step) with
`${alone:TYPE,KEY,VALUE}` (`alone` below): the value holds while the mix is that type alone.
A user who composes a mix on top of that file (`env_mix=cartpole +env@env_mix.types.acrobot=acrobot`)
gets the learner's own defaults instead, as from any other file, and their `auto`s follow the
mix; a stage or the command line that sets the key still overrules both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlpipe.spec import ConfigError, EnvTypeSpec

AUTO = "auto"
MIX_KEYS = ("rollout_len", "update_envs", "minibatch_size")  # summary.json's `learner`, the log line
ALONE = "alone"  # the resolver's name in the config files


def alone(type_name: str, key: str, value: Any, mix_types: list[str], learner_defaults: Any) -> Any:
    """`${alone:TYPE,KEY,VALUE}`: VALUE while the composed mix (`mix_types`) is TYPE alone, else
    learner.KEY as conf/learner/ppo.yaml (`learner_defaults`) sets it."""
    if list(mix_types) == [type_name]:
        return value
    if key not in learner_defaults:
        raise ConfigError(
            f"${{{ALONE}:{type_name},{key},...}}: learner.{key} is not a setting of conf/learner/ppo.yaml; "
            f"allowed is one of its keys ({', '.join(learner_defaults)})"
        )
    return learner_defaults[key]


def register_alone(conf_dir: Callable[[], Path]) -> None:
    """`${alone:...}` registered with OmegaConf (rlpipe/config.py, on import: before any config
    resolves); the learner's defaults are read from `conf_dir()`'s learner/ppo.yaml once."""

    def resolver(type_name: str, key: str, value: Any, *, _root_: DictConfig) -> Any:
        return alone(type_name, key, value, list(_root_.env_mix.types), _learner_defaults(conf_dir()))

    OmegaConf.register_new_resolver(ALONE, resolver, replace=True)


@functools.cache
def _learner_defaults(conf_dir: Path) -> DictConfig:
    """At module level, not in `register_alone`: Hydra's submitit launchers pickle OmegaConf's
    resolvers with the job, and a cache around a local function cannot be pickled (every
    `hydra/launcher=submitit_local` or `submitit_slurm` sweep failed with that traceback)."""
    return OmegaConf.load(conf_dir / "learner" / "ppo.yaml")


def resolve(learner: Any, env_types: tuple[EnvTypeSpec, ...], env_count: int) -> dict[str, str]:
    """Writes the resolved ints over the learner's `auto` settings (in place, as RunSpec writes
    the process layout's); returns how each was chosen, by key, for the log and summary.json
    (a number set in the config: "set")."""
    how = {key: "set" for key in MIX_KEYS}
    if learner.rollout_len == AUTO:
        asks = {t.name: t.learner["rollout_len"] for t in env_types if "rollout_len" in t.learner}
        if learner.type_settings != "per_type":
            asks = {}
        longest = max(asks.values(), default=0)
        if longest > learner.type_rollout_len:
            learner.rollout_len = longest
            names = ", ".join(sorted(name for name, asked in asks.items() if asked == longest))
            how["rollout_len"] = f"auto: the longest a type asks for ({names}'s env node)"
        else:
            learner.rollout_len = learner.type_rollout_len
            how["rollout_len"] = "auto: learner.type_rollout_len (no type of the mix asks for more)"
    if learner.update_envs == AUTO:
        weights = [t.weight for t in env_types]
        shares = sum(weights) / max(weights)  # k for k types of equal weight
        wanted = round(learner.update_envs_per_type * shares)
        learner.update_envs = min(wanted, env_count)
        capped = " (capped by env_count)" if learner.update_envs < wanted else ""
        biggest = max(env_types, key=lambda t: t.weight).name
        how["update_envs"] = (
            f"auto: {learner.update_envs_per_type} x {shares:.3g} (the mix's weights / {biggest}'s){capped}"
        )
    return how


def describe(learner: Any, how: dict[str, str]) -> str:
    """One log line: each setting's value and where it came from."""
    return ", ".join(f"{key} {getattr(learner, key)} ({how.get(key, 'set')})" for key in MIX_KEYS)
