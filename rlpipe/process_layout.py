"""The process layout chosen from the machine: how many worker processes a run starts, how
many envs each holds, in how many slices, and which CPUs they run on (`groups.size: auto`,
`worker.slices: auto`, `worker.cpu_affinity: auto`). `resolve` runs once, where the config
becomes a RunSpec (rlpipe/config.py); everything after reads plain values.

The rule (docs/benchmarks.md has the measurements behind it):

- workers: one per `ENVS_PER_SLICE` envs (the origin system's 70-env groups), but at most
  `WORKERS_PER_CPU` per CPU they step on (under `learner_core` below, one CPU fewer than the
  usable ones; under a list of CPUs, as many as it names). On 2 CPUs 7,000 CartPoles stepped
  1.21-1.24x faster in 20 processes of 350 than in 100 of 70 (benchmarks/engine_sps.py, the
  same run): each process switch refills the caches with another interpreter and its envs,
  and the scheduler juggles fewer tasks.
  The cap counts the workers' own CPUs because under `learner_core` all of them share one
  CPU on a 2-CPU machine: 20 processes there trained 0.68x, 0.68x and 0.57x of
  SyncVectorEnv under `backlog=hold`, where 10 trained 0.78x, 0.71x and 0.67x (the same runs,
  docs/benchmarks.md). On 128 CPUs the cap is 1,270, so 7,000 envs keep the origin's
  100 x 70; below the cap (64 envs on 2 CPUs) the layout is the 70-env groups rlpipe has
  always run.
  With random actions (`learner.mode=random`, the engine's benchmark mode) the cap is
  `RANDOM_WORKERS_PER_CPU`. There a round costs the driver little (no inference), so two
  processes keep a CPU busy: one steps while the other's actions come. Fewer processes
  refill fewer caches. On 2 CPUs 7,000 CartPoles stepped 1.07-1.10x faster in 4 processes
  of 1,750 than in 20 of 350 in each of four runs of both (1.00-1.15x in four A/B pairs of
  separate runs), and 6 or 8 processes fell between.
  1,000 CartPoles stepped 1.07x faster in 4 of 250 than in 15 of 67 (one run). PPO keeps
  10: its rounds wait for inference, and 4 of 1,750 trained less.
- group size: the envs shared evenly among those workers (ceil).
- slices: as many as keep each slice at most `ENVS_PER_SLICE` envs (the rollout blocks, the
  doorbells and the PPO batches stay the origin's 70-env slices), and 2 (double-buffered:
  one slice steps while the other waits for its actions) while there are fewer workers than
  twice the CPUs they step on; with more, other workers fill a core while one waits.
  With random actions a slice holds up to `RANDOM_ENVS_PER_SLICE` envs: there is no rollout
  block to keep at 70, and each slice costs its worker a fixed turn of Python (its doorbell,
  its rewards copied, its obs published, the beat: 4.6 % of a worker's CPU at 70 envs, from
  `perf`) and the driver a ring. On 2 CPUs 7,000 CartPoles in 4 x 1,750 stepped 1.07x,
  1.08x and 1.09x faster in 5 slices of 350 than in 25 of 70 (the medians of three sets of
  3-4 interleaved 30 s runs); 3 or 7 slices came out alike, 10 between. 1,000 CartPoles
  stepped 1.07x faster in 4 x 250 in one slice than in four (medians of three).
- CPUs: `learner_core` when PPO trains on this machine's CPU with 2 or more usable CPUs (the
  update thread gets a core of its own; the workers the rest), `null` otherwise. Measured on
  2 CPUs at 7,000 envs, `learner.backlog=hold`: trained samples/s 0.55-0.67x of
  SyncVectorEnv with it against 0.41-0.53x without, higher in each of three runs and both
  layouts; under `backlog=drop` (day4's) 2.5-3x the trained samples for 0.7-0.8x the env
  steps; at 1,000 envs as good or better (hold 0.47x against 0.41x, 0.43x both). The
  learner's CPU becomes its own only once every env has stepped (the fleet does it,
  rlpipe/supervisor/fleet.py): start-up builds its envs on every CPU. Under `backlog` hold
  or sync, where the run has a cgroup driver, the fleet does it by weight, not by pinning:
  the workers keep every CPU but their cgroup weighs below the update and the driver. The
  worker count stays the one counted here (the workers step on about one CPU fewer either
  way).

Usable CPUs are this process's affinity mask, capped by its cgroup's CPU quota (v2 cpu.max,
v1 cpu.cfs_quota_us), and shared among the torchrun ranks of one node (LOCAL_WORLD_SIZE).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

AUTO = "auto"
LEARNER_CORE = "learner_core"
ENVS_PER_SLICE = 70  # the origin system's group (docs/origin.md): at most this many a slice
WORKERS_PER_CPU = 10  # at most this many worker processes per CPU they step on
RANDOM_WORKERS_PER_CPU = 2  # ... with random actions, whose rounds cost the driver little
RANDOM_ENVS_PER_SLICE = 350  # ... and at most this many envs a slice (no rollout block to keep)
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


# --- the machine --------------------------------------------------------------------------------


def _quota(path: Path, v2: bool) -> Optional[float]:
    """The CPU quota set on one cgroup directory, in CPUs (None: none set, or unreadable)."""
    try:
        if v2:
            quota, period = (path / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = int((path / "cpu.cfs_quota_us").read_text())
        return None if quota < 0 else quota / int((path / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _chain(mount: Path, rel: str) -> list[Path]:
    """The cgroup's directory under `mount` and its ancestors up to the mount (a limit set on
    any of them applies). In a container the path /proc shows may lie outside its mount: then
    the mount itself is the container's cgroup."""
    start = mount / rel.lstrip("/")
    if not start.is_dir():
        start = mount
    dirs = [start]
    while dirs[-1] != mount and mount in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> Optional[float]:
    """The tightest CPU quota of this process's cgroup and its ancestors, in CPUs (None: none)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "" and (root / "cgroup.controllers").is_file():  # v2, unified
            limits += [_quota(d, v2=True) for d in _chain(root, rel)]
        elif "cpu" in controllers.split(","):  # v1
            for name in (controllers, "cpu,cpuacct", "cpu"):
                if (root / name).is_dir():
                    limits += [_quota(d, v2=False) for d in _chain(root / name, rel)]
                    break
    limits = [q for q in limits if q is not None]
    return min(limits) if limits else None


def usable_cpus() -> float:
    """CPUs this run's processes may use: the affinity mask, capped by a cgroup CPU quota,
    shared among the torchrun ranks of this node (a fraction is kept: 1.5 CPUs allow 15
    workers)."""
    cpus = float(len(os.sched_getaffinity(0)))
    limit = cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, limit)
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return cpus / max(1, int(ranks)) if ranks.isdigit() else cpus


# --- the rule -----------------------------------------------------------------------------------


def workers_per_cpu(learner_mode: str) -> int:
    """The cap of worker processes per CPU they step on: RANDOM_WORKERS_PER_CPU with random
    actions, WORKERS_PER_CPU otherwise."""
    return RANDOM_WORKERS_PER_CPU if learner_mode == "random" else WORKERS_PER_CPU


def envs_per_slice(learner_mode: str) -> int:
    """The most envs a slice holds under worker.slices=auto: RANDOM_ENVS_PER_SLICE with random
    actions, ENVS_PER_SLICE (the rollout block) otherwise."""
    return RANDOM_ENVS_PER_SLICE if learner_mode == "random" else ENVS_PER_SLICE


def auto_workers(env_count: int, cpus: float, per_cpu: int = WORKERS_PER_CPU) -> int:
    """Worker processes for `env_count` envs stepped on `cpus` CPUs: one per ENVS_PER_SLICE
    envs, at most `per_cpu` per CPU, at least one."""
    most = max(1, round(per_cpu * cpus))
    return max(1, min(most, math.ceil(env_count / ENVS_PER_SLICE)))


def auto_group_size(env_count: int, cpus: float, per_cpu: int = WORKERS_PER_CPU) -> int:
    """groups.size=auto: the envs shared evenly among `auto_workers`."""
    return math.ceil(env_count / auto_workers(env_count, cpus, per_cpu))


def auto_slices(env_count: int, group_size: int, cpus: float, per_slice: int = ENVS_PER_SLICE) -> int:
    """worker.slices=auto: at most `per_slice` envs a slice; 2 (double-buffered) while there
    are fewer workers than twice the CPUs they step on; never more slices than envs."""
    workers = math.ceil(env_count / group_size)
    envs = min(group_size, env_count)  # the largest group's envs
    double = 2 if workers < 2 * cpus else 1
    return min(envs, max(math.ceil(envs / per_slice), double))


def trains_on_cpu(learner_mode: str, learner_device: str) -> bool:
    """Whether a PPO update thread runs on this machine's CPUs (device auto counts as CPU:
    CUDA is only known once torch is imported, after validation)."""
    return learner_mode == "ppo" and learner_device != "cuda"


# --- the layout ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What the run starts: `workers` processes of `group_size` envs (the last may hold fewer)
    in `slices` slices each; the workers' CPUs (None: every CPU) and the CPU kept for the PPO
    update thread (None: not pinned). `pin_after_startup`: the workers run on every CPU until
    every env has stepped, then on `worker_cpus` (learner_core). `auto`: the keys that were
    `auto`, `cpus` the usable CPUs the rule saw."""

    env_count: int
    cpus: float
    workers: int
    group_size: int
    slices: int
    affinity: str  # null | learner_core | cpus: what the workers' CPUs are
    worker_cpus: Optional[tuple[int, ...]]
    learner_cpu: Optional[int]
    pin_after_startup: bool
    auto: tuple[str, ...]

    @property
    def largest_group(self) -> int:
        """The envs of the first (largest) group: an explicit size may exceed env_count."""
        return min(self.group_size, self.env_count)

    @property
    def envs_per_slice(self) -> int:
        return math.ceil(self.largest_group / self.slices)

    def describe(self) -> str:
        """One line for the start-up log: what runs where, and what auto chose it from."""
        chosen = f"; auto: {', '.join(self.auto)} from {self.cpus:g} usable CPUs" if self.auto else ""
        if self.affinity == LEARNER_CORE:
            cpus = (
                f"workers on CPUs {_cpu_list(self.worker_cpus)} once every env stepped, "
                f"CPU {self.learner_cpu} kept for the PPO update"
            )
        elif self.worker_cpus is not None:
            cpus = f"workers on CPUs {_cpu_list(self.worker_cpus)}"
        else:
            cpus = "workers on every CPU"
        return (
            f"{_count(self.workers, 'worker')} of {self.largest_group} envs, {_count(self.slices, 'slice')} "
            f"of <= {self.envs_per_slice} envs each, {cpus}{chosen}"
        )

    def as_dict(self) -> dict:
        """summary.json's `layout`."""
        return {
            "workers": self.workers,
            "group_size": self.group_size,
            "slices": self.slices,
            "envs_per_slice": self.envs_per_slice,
            "cpu_affinity": self.affinity,
            "worker_cpus": list(self.worker_cpus) if self.worker_cpus is not None else None,
            "learner_cpu": self.learner_cpu,
            "usable_cpus": round(self.cpus, 3),
            "auto": list(self.auto),
        }


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("s" if n != 1 else "")


def _cpu_list(cpus: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cpus)


def resolve(
    env_count: int, size, slices, affinity, learner_mode: str, learner_device: str, cpus: Optional[float] = None
) -> Layout:
    """The layout from the settings as checked (size and slices: auto or an int; affinity:
    None, auto, learner_core or a tuple of CPUs); `cpus`: the usable CPUs (default: this
    machine's). An explicit value is kept as it is; rlpipe.config_checks checks the ints."""
    cpus = usable_cpus() if cpus is None else cpus
    auto = tuple(
        key
        for key, value in (("groups.size", size), ("worker.slices", slices), ("worker.cpu_affinity", affinity))
        if value == AUTO
    )
    mask = sorted(os.sched_getaffinity(0))
    worker_cpus, learner_cpu, how = None, None, "null"
    if affinity in (AUTO, LEARNER_CORE):
        # auto asks more than the mask: two CPUs' worth of quota, and one learner on the node
        # (torchrun ranks would all keep the same CPU for their updates)
        pays = affinity == LEARNER_CORE or (cpus >= 2 and os.environ.get("WORLD_SIZE", "1") in ("", "1"))
        if pays and trains_on_cpu(learner_mode, learner_device) and len(mask) >= 2:
            worker_cpus, learner_cpu, how = tuple(mask[1:]), mask[0], LEARNER_CORE
    elif affinity is not None:
        worker_cpus, how = tuple(affinity), "cpus"
    # the CPUs the workers step on once start-up is over: under learner_core one fewer; a list
    # of CPUs, as many as it names (within the usable ones)
    stepping = cpus
    if how == LEARNER_CORE:
        stepping = max(1.0, cpus - 1)
    elif how == "cpus":
        stepping = min(cpus, float(len(set(worker_cpus))))
    group_size = auto_group_size(env_count, stepping, workers_per_cpu(learner_mode)) if size == AUTO else size
    n_slices = auto_slices(env_count, group_size, stepping, envs_per_slice(learner_mode)) if slices == AUTO else slices
    return Layout(
        env_count=env_count,
        cpus=cpus,
        workers=math.ceil(env_count / group_size),
        group_size=group_size,
        slices=n_slices,
        affinity=how,
        worker_cpus=worker_cpus,
        learner_cpu=learner_cpu,
        pin_after_startup=how == LEARNER_CORE,
        auto=auto,
    )
