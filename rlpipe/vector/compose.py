"""The vector's RunSpec, composed from `conf/` like a training run's: every setting keeps its
one declaration there (and its check in rlpipe/config.py). Only what a vector of identical
envs implies is overridden: the env mix (one type), the env count, the seed and every group
awake from the start (a learner stepping all envs has no cold/hot ramp to wait for)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from rlpipe.config import ConfigError, RunSpec, conf_dir, register_schema, run_spec
from rlpipe.config_errors import check_known_keys, hydra_refusal


def is_rlpipe_type(name: str) -> bool:
    """A node of conf/env/ (cartpole, faulty, web_sim, ...) rather than a Gymnasium id."""
    return "/" not in name and ":" not in name and (conf_dir() / "env" / f"{name}.yaml").is_file()


def mix_overrides(env_id_or_type: str) -> list[str]:
    """A one-type env_mix: a conf/env/ node by its name, anything else as a Gymnasium id."""
    if not isinstance(env_id_or_type, str) or not env_id_or_type:
        raise TypeError(f"rlpipe.vector.make: env id {env_id_or_type!r} is not a non-empty string")
    if is_rlpipe_type(env_id_or_type):
        if env_id_or_type == "cartpole":
            return ["env_mix=cartpole"]
        # env_mix=cartpole is the one-type mix; swap its type for the one asked for
        return [
            "env_mix=cartpole",
            "~env_mix.types.cartpole",
            "~env_mix.weights.cartpole",
            f"+env@env_mix.types.{env_id_or_type}={env_id_or_type}",
            f"+env_mix.weights.{env_id_or_type}=1.0",
        ]
    # Hydra's override grammar needs quotes around ids with '/' or ':' (ALE/Pong-v5, mod:Id)
    return ["env_mix=gym", f"env_mix.id='{env_id_or_type}'"]


# keys the vector sets from make()'s arguments: an override of one would contradict them
IMPLIED = {
    "env_count": "num_envs",
    "run.seed": "seed",
    "env_mix": "env id (a conf/env/ name or a Gymnasium id)",
    "env_mix.id": "env id (a conf/env/ name or a Gymnasium id)",
}


def check_not_implied(override: str) -> None:
    """ConfigError for an override of a key make()'s own arguments set."""
    key = override.split("=", 1)[0].lstrip("+~")
    if key in IMPLIED:
        raise ConfigError(
            f"rlpipe.vector.make: the override {override!r} sets {key}, which the vector sets from "
            f"make()'s {IMPLIED[key]} argument: pass that instead."
        )


def vector_spec(env_id_or_type: str, num_envs: int, seed: int | None, overrides: list[str]) -> RunSpec:
    """The composed, checked spec of a vector (ConfigError names a wrong key or value)."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"rlpipe.vector.make: num_envs must be a positive int, got {num_envs!r}")
    register_schema()
    # the caller's learner runs in the caller's process, not in a PPO thread of ours: no CPU is
    # kept from the workers (cpu_affinity=auto would keep one that nothing ever uses)
    # worker.crash_backoff=false: the caller sees every fault as it happens, none parked (issue 49)
    base = mix_overrides(env_id_or_type) + [
        f"env_count={num_envs}",
        "worker.cpu_affinity=null",
        "worker.crash_backoff=false",
    ]
    if seed is not None:
        base.append(f"run.seed={int(seed)}")
    for override in overrides:
        check_not_implied(override)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        try:
            cfg = compose(config_name="config", overrides=base + list(overrides))
        except Exception as exc:  # what Hydra refuses, said as the CLI says it (rlpipe.config_errors)
            text = hydra_refusal(exc, RunSpec)
            if text is None:
                raise
            raise ConfigError(text) from exc
    check_known_keys(cfg, RunSpec)  # a `+key` no setting declares: nothing would read it
    spec = run_spec(cfg)
    n_groups = -(-num_envs // spec.groups.size)
    spec.groups.hot = max(spec.groups.hot, n_groups)  # every group steps from the start
    return spec
