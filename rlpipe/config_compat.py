"""Configs saved by an older rlpipe (a run's .hydra/config.yaml, read back to resume or
evaluate it): the settings added since take today's defaults from conf/. Kept apart from
rlpipe.config, whose job is the schema and the checks of a config being composed now."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def fill_newer_settings(cfg: DictConfig, conf: Path) -> None:
    """A run saved by an older rlpipe lacks the settings added since (eval:, logging's resource
    keys, run.stall_timeout_s...): they take today's defaults from conf/, which is what that
    run did without them (nothing it recorded depends on them). Skipped inside a Hydra app,
    which cannot compose a second config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def missing(node, prefix=""):
        for key in node:
            if OmegaConf.is_missing(node, key):
                yield prefix + str(key)
            elif OmegaConf.is_dict(node[key]) and not str(key).startswith("types"):
                yield from missing(node[key], f"{prefix}{key}.")

    keys = list(missing(cfg))
    if not keys or GlobalHydra.instance().is_initialized():
        return
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        defaults = compose(config_name="config")
    absent = object()
    for key in keys:
        value = OmegaConf.select(defaults, key, default=absent)
        if value is not absent:  # a key conf/ no longer has stays missing
            OmegaConf.update(cfg, key, value, merge=False)
