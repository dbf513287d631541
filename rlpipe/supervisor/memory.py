"""Memory contained by default (issue 49): every process that runs env code (the awake
workers, the random-return probe) under one memory limit, and the driver the last thing the
kernel's OOM killer picks.

An env that grew 50 MB a step took the machine from 0.8 to 6.5 GB in 16 s with nothing said;
on a machine without swap such an env reaches the OOM killer, which may pick the driver.

- `groups.active_mem_mb` (auto: 3/4 of the memory available when the run starts) is the
  limit of the run's `active` cgroup (v2 memory.max, v1 memory.limit_in_bytes), which every
  awake worker joins at its start and the probe too. Past it the kernel kills the biggest
  process inside, the leaking env's worker: it is replaced and its death attributed to the env
  it was stepping (rlpipe.supervisor.deaths), so errors_top10.md names the type.
- Without a writable memory cgroup, each worker polls its own RSS (`worker.max_rss_mb`, when
  unset: the limit shared by the workers) and leaves to be replaced past it; said once.
- Processes running env code raise their oom_score_adj (`rlpipe.proctree.ENV_OOM_SCORE_ADJ`); the driver
  lowers its own where it may (CAP_SYS_RESOURCE), so it is the last the OOM killer picks.
"""

from __future__ import annotations

import logging

from rlpipe.proctree import set_oom_score_adj

log = logging.getLogger("rlpipe.memory")
DRIVER_OOM_SCORE_ADJ = -500  # lowering needs CAP_SYS_RESOURCE: tried, passed by when refused


def available_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def resolve_active_mem_mb(setting) -> int:
    """groups.active_mem_mb as MiB (auto: 3/4 of what is available now)."""
    return int(available_mb() * 3 // 4) if setting == "auto" else int(setting)


def protect_driver() -> None:
    """The driver: the last process of the run the OOM killer picks."""
    if not set_oom_score_adj(DRIVER_OOM_SCORE_ADJ):
        log.info("driver oom_score_adj left at its default (lowering it needs CAP_SYS_RESOURCE)")


def contain_memory(cgroup_name: str, configured_mb, limit_mb: int, n_workers: int):
    """At the fleet's start: the driver protected, and worker.max_rss_mb as each worker gets
    it: as configured, else (no memory cgroup) its share of the limit; said once."""
    protect_driver()
    if cgroup_name != "none":
        log.info(
            "memory: awake workers and the random-return probe limited to %d MiB together (cgroup %s)",
            limit_mb,
            cgroup_name,
        )
        return configured_mb
    if configured_mb is not None:
        return configured_mb
    share = max(256, limit_mb // max(1, n_workers))
    log.warning(
        "no writable memory cgroup: each worker polls its own RSS and leaves past %d MiB "
        "(groups.active_mem_mb %d MiB over %d workers; worker.max_rss_mb sets it)",
        share,
        limit_mb,
        n_workers,
    )
    return share
