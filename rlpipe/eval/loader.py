"""A finished (or killed) run, rebuilt from its own files: config, env plan and trained policy.

Nothing but the run directory is read: `.hydra/config.yaml` (what Hydra saved when the run
started) is checked into the same RunSpec the engine runs on (`run_spec`), the env types are described
with the same `plan_mix`, and the policy is built exactly as the learner builds it, then
loaded from the newest checkpoint (or `export/policy.pt` when the run exported one and its
checkpoints are gone). Checkpoint files are only read: unlike a resume, evaluation never
renames a file it cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlpipe.config import ConfigError, RunSpec, run_spec
from rlpipe.envs.registry import MixPlan, plan_mix


class EvalError(ConfigError):
    """The run cannot be evaluated (no checkpoint, a config that cannot be rebuilt, a bad
    argument): one paragraph for the user, exit code 2."""

    what = "eval error"


@dataclass
class LoadedRun:
    run_dir: Path
    spec: RunSpec
    plan: MixPlan
    policy: object  # rlpipe.learner.policy.Policy, in eval mode
    source: Path  # the checkpoint or export the weights came from
    env_steps: int  # env steps the run had made when those weights were saved


def load_spec(run_dir: Path) -> RunSpec:
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise EvalError(
            f"{run_dir} has no .hydra/config.yaml, so its env types cannot be rebuilt: "
            "pass the directory of a run started with `python -m rlpipe` (outputs/<date>/"
            "<time>/ or one job's folder of a multirun, multirun/<date>/<time>/<n>/)."
        )
    try:
        cfg = OmegaConf.load(path)
        # evaluation plays on the CPU, wherever the run trained: a run trained on cuda is
        # evaluated on a machine without a GPU (its checkpoints hold host tensors)
        cfg.learner.device = "cpu"
        return run_spec(cfg)
    except (ConfigError, OmegaConfBaseException, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise EvalError(
            f"the run's config {path} cannot be rebuilt by this rlpipe "
            f"({type(exc).__name__}: {exc}); was it written by another version? "
            "Evaluate it with the checkout that trained it."
        ) from exc


def load_plan(spec: RunSpec, config_path: Path) -> MixPlan:
    try:
        return plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
    except ConfigError as exc:
        raise EvalError(f"the env types of {config_path} cannot be built here: {exc}") from exc


def _weights(run_dir: Path) -> tuple[Path, dict]:
    """(file, payload with 'policy' and 'compat') of the newest saved weights."""
    from rlpipe.learner.checkpoint import CheckpointError, load_latest

    ckpt_dir = run_dir / "checkpoints"
    export = run_dir / "export" / "policy.pt"
    try:
        found = load_latest(ckpt_dir, quarantine=False)
    except CheckpointError as exc:
        if not export.is_file():
            raise EvalError(f"{exc}; and {export} does not exist") from exc
        found = None
    if found is not None:
        path, payload = found
        return path, {**payload, "env_steps": int(payload.get("counters", {}).get("env_steps", 0))}
    if export.is_file():
        return export, _read_weights(export)
    raise EvalError(
        f"{run_dir} has no checkpoint to evaluate: {ckpt_dir} holds no ckpt_*.pt and "
        f"{export} does not exist. A run saves one every learner.checkpoint_interval_s "
        "and when it ends; a run killed with -9 before its first interval, a "
        "learner.mode=random run and a day0 validation leave none. Train longer (or "
        "with a shorter learner.checkpoint_interval_s) and evaluate again."
    )


def _read_weights(path: Path) -> dict:
    """The payload of an export or of the driver's eval snapshot (a 'policy' entry, a 'compat'
    and the 'env_steps' they were taken at)."""
    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise EvalError(f"{path} is unreadable: {type(exc).__name__}: {exc}") from exc
    if not isinstance(payload, dict) or "policy" not in payload:
        raise EvalError(f"{path} is not rlpipe weights (no 'policy' entry)")
    return payload


def _expected_compat(spec: RunSpec, plan: MixPlan) -> dict:
    """The parts of CentralLearner.compat() that fix the policy's shape."""
    from rlpipe.learner.central import POLICY_LAYOUT

    lc = spec.learner
    return {
        "obs_keys": [[k.name, list(k.shape), k.dtype] for k in plan.obs_keys],
        "types": list(plan.names),
        "discrete_n": plan.actions.discrete_n,
        "cont_dim": plan.actions.cont_dim,
        "hidden": list(lc.hidden),
        "policy": POLICY_LAYOUT,
        "cnn": [*lc.cnn_channels, lc.cnn_out],
    }


def load_run(run_dir: str | Path, weights: Path | None = None) -> LoadedRun:
    """The run's spec, plan and trained policy (from `weights`, e.g. the driver's eval
    snapshot, else the newest checkpoint or the export); EvalError (one paragraph) when any is
    missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise EvalError(f"run directory {run_dir} does not exist")
    spec = load_spec(run_dir)
    # The weights are looked for before the env types are built: a run without a checkpoint
    # is told so at once, not after every type's env was constructed.
    source, payload = _weights(run_dir) if weights is None else (Path(weights), _read_weights(Path(weights)))
    plan = load_plan(spec, run_dir / ".hydra" / "config.yaml")

    from rlpipe.learner.policy import Policy

    theirs, ours = payload.get("compat") or {}, _expected_compat(spec, plan)
    diff = sorted(k for k in ours if theirs.get(k) != ours[k])
    if diff:
        raise EvalError(
            f"{source} does not fit the policy that {run_dir}/.hydra/config.yaml "
            f"describes: {', '.join(diff)} differ (weights: "
            f"{[theirs.get(k) for k in diff]}, config: {[ours[k] for k in diff]})"
        )
    lc = spec.learner
    policy = Policy(plan, plan.obs_keys, lc.hidden, lc.cnn_channels, lc.cnn_out)
    try:
        policy.load_state_dict(payload["policy"])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise EvalError(f"{source} cannot be loaded into the run's policy: {str(exc).splitlines()[0]}") from exc
    policy.eval()
    return LoadedRun(run_dir, spec, plan, policy, source, int(payload.get("env_steps", 0)))
