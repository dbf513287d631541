"""Beyond one machine: DD-PPO (Wijmans et al. 2019) across torchrun ranks.

The engine stays single-node (shared memory, one driver per node-local engine); scale-out
runs one whole engine per rank, launched by torchrun (any --nnodes / --nproc_per_node, or
Slurm's srun running torchrun). When torchrun's WORLD_SIZE and RANK are set:

- every rank runs its own driver, workers, board, embedded Redis and learner on its share of
  `env_count` (`share`: the first `env_count % world` ranks take one env more); its env ids
  start at its offset, so ids are globally unique (env seeds, lifecycle rows and error
  records carry global ids), and its run id (segment names, Redis keys, socket dirs) carries
  `r<rank>`;
- `learner.update_envs` and `learner.minibatch_size` stay figures of the whole job: each
  rank gathers its share of update_envs, and an update cuts every rank's batch into
  ceil(global batch / minibatch_size) minibatches, so two ranks of 32 envs run the same PPO
  as one rank of 64;
- updates are rounds taken by all ranks together (`rlpipe.ranks.learner`): statistics of the
  batch (PopArt's per-type return moments, per-type advantage moments) and gradients are
  all-reduced, so parameters, PopArt buffers, optimizer state and the learning-rate
  schedule (a function of the env steps summed over ranks) stay identical; the end of the
  run compares checksums of all of it across ranks (`summary.json` `dist.params_in_sync`);
- rank 0 writes TensorBoard and the run's `summary.json` (SPS summed over ranks); rank N
  writes its logs, lifecycle db, checkpoints and its own summary under `rank<N>/` in the
  same run directory, which all ranks take from rank 0.

The driver sees a rank only through its run mode (`Ranks`, rlpipe/ranks/run.py, one
`rlpipe.supervisor.runmode.RunMode`); this module itself imports no torch, so the app reads
the launcher's environment before deciding to.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from rlpipe.config import RunSpec
from rlpipe.spec import ConfigError


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    job_id: str  # TORCHELASTIC_RUN_ID (torchrun's --rdzv-id): the same on every rank
    restart: int  # TORCHELASTIC_RESTART_COUNT: 0, then 1, 2... after --max-restarts restarts


def rank_from_env(environ=None) -> RankInfo | None:
    """This process's rank under torchrun (or any launcher setting WORLD_SIZE and RANK);
    None in a plain single process."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", 0))
    except ValueError as exc:
        raise ConfigError(
            f"Invalid torchrun environment (RANK={env.get('RANK')!r}, WORLD_SIZE="
            f"{env.get('WORLD_SIZE')!r}): {exc}. These are set by torchrun; unset them "
            "to run a single process."
        ) from exc
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"Invalid torchrun environment: RANK={rank} is not in [0, WORLD_SIZE={world}).")
    return RankInfo(rank, world, local, env.get("TORCHELASTIC_RUN_ID", "none"), restart)


def share(total: int, world: int, rank: int) -> tuple[int, int]:
    """(count, offset) of rank's share of `total` items: the first `total % world` ranks
    take one more, offsets follow in rank order, so the shares tile [0, total)."""
    base, extra = divmod(total, world)
    return base + (rank < extra), rank * base + min(rank, extra)


def rank_spec(spec: RunSpec, info: RankInfo) -> RunSpec:
    """This rank's run: its share of env_count (and of update_envs) and its env-id offset.
    Raises ConfigError (one paragraph, naming the key) when the job cannot be split."""
    w = info.world_size
    n_types = len(spec.env_types)
    if spec.env_count < w * n_types:
        raise ConfigError(
            f"Invalid config value env_count={spec.env_count}: under torchrun with {w} ranks, allowed is "
            f"at least {w * n_types} (each rank runs its share of env_count and needs one env of each "
            f"of the {n_types} env types). Raise env_count or run fewer ranks."
        )
    update_total = min(spec.learner.update_envs, spec.env_count)
    if update_total < w:
        raise ConfigError(
            f"Invalid config value learner.update_envs={spec.learner.update_envs}: under torchrun with "
            f"{w} ranks, allowed is at least {w} (each rank gathers its share of the update's env-rollouts)."
        )
    if spec.learner.mode != "ppo":
        raise ConfigError(
            f"Invalid config value learner.mode={spec.learner.mode!r}: under torchrun only ppo is "
            "allowed (ranks exist to train together; run random-action benchmarks as one process)."
        )
    count, offset = share(spec.env_count, w, info.rank)
    updates, _ = share(update_total, w, info.rank)
    learner = dataclasses.replace(spec.learner, update_envs=updates)
    # a torchrun restart continues the run (auto: a rank killed before its first checkpoint starts fresh)
    run = dataclasses.replace(spec.run, resume=spec.run.resume or ("auto" if info.restart > 0 else False))
    ranked = dataclasses.replace(spec, env_count=count, learner=learner, run=run)
    ranked.env_id_offset = offset  # not a setting, so replace() left it at 0
    return ranked


def hydra_run_dir(default: str) -> str:
    """Hydra's `hydra.run.dir` (the `rlpipe_run_dir` resolver in conf/config.yaml): the
    timestamped default in a single process; under torchrun `<date dir>/torchrun-<run id>`
    for rank 0 and `.../rank<N>` for rank N, the same on every rank and every node without
    the user passing hydra.run.dir, and the same again after a torchrun restart (so
    run.resume finds the run's checkpoints). The driver still takes rank 0's directory by
    broadcast (`Ranks.start`), whatever launched the ranks."""
    info = rank_from_env()
    if info is None:
        return default
    root = Path(default).parent / f"torchrun-{info.job_id}"
    return str(root if info.rank == 0 else root / f"rank{info.rank}")
