"""cgroups for dormant worker groups: v2 (cpu.max, memory.max), v1 (cpu.cfs_quota_us,
memory.limit_in_bytes), or none.

Layout per run: `<root>/rlpipe_<run_id>/g<k>` for each dormant group (cpu and memory
limits) and `<root>/rlpipe_<run_id>/active` (no limits) where woken groups move. A worker
writes its own pid into its group's cgroup right after fork, before it builds any env; the
driver moves it to `active` on wake. Everything is removed at exit, and a new run removes
the directories of runs whose driver pid is gone.

`auto` prefers v2 when the unified hierarchy delegates both the cpu and memory controllers,
else v1 when its cpu and memory hierarchies are writable, else none, said once in the log.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rlpipe.procs import pid_alive

log = logging.getLogger("rlpipe.cgroups")
CPU_PERIOD_US = 100_000
SHARES_DEFAULT, SHARES_MAX = 1024, 262_144  # cgroup v1 cpu.shares
WEIGHT_DEFAULT, WEIGHT_MAX = 100, 10_000  # cgroup v2 cpu.weight
# The run's workers together under learner_core, once every env has stepped: about one task at
# nice 15 (36-45), so the PPO update and the driver (1,024 each) take a CPU whenever they want
# it and the workers fill the rest, where pinning them off the update's CPU left that CPU
# idle 13-15 % of the time while they waited on theirs (docs/benchmarks.md, "The learner's
# core by weight"). Still above an idle-priority task (3) and a nice-19 one (15).
LEARNER_FIRST_SHARES, LEARNER_FIRST_WEIGHT = 40, 4
_RUN_DIR_RE = re.compile(r"^rlpipe_(\d+)-[0-9a-f]+(?:r\d+)?$")


@dataclass(frozen=True)
class CgroupRoots:
    """Where each hierarchy lives; tests point these at directories they control."""

    v2: Path = Path("/sys/fs/cgroup/unified")
    v1: Path = Path("/sys/fs/cgroup")

    @classmethod
    def detect(cls) -> "CgroupRoots":
        v2 = Path("/sys/fs/cgroup/unified")
        if not v2.is_dir() and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            v2 = Path("/sys/fs/cgroup")  # a pure-v2 machine mounts it at the root
        return cls(v2=v2, v1=Path("/sys/fs/cgroup"))


def _writable_dir(path: Path) -> bool:
    if not path.is_dir():
        return False
    probe = path / f"rlpipe_probe_{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        probe.rmdir()
    except OSError:
        pass
    return True


def _v2_usable(root: Path) -> bool:
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
        subtree = (root / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
    return {"cpu", "memory"} <= set(controllers) and {"cpu", "memory"} <= set(subtree) and _writable_dir(root)


def _v1_usable(root: Path) -> bool:
    return all(_writable_dir(root / c) for c in ("cpu", "memory"))


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class CgroupDriver:
    """Base: `none`. Subclasses place pids; every method is a no-op here."""

    name = "none"

    def __init__(
        self,
        run_id: str,
        cpu_pct: float,
        mem_mb: int,
        roots: CgroupRoots,
        n_groups: int = 1,
        active_mem_mb: int | None = None,
    ):
        self.run_id = run_id
        self.active_mem_mb = active_mem_mb  # the awake workers' and the probe's limit together
        self.n_groups = n_groups
        self.cpu_pct = cpu_pct
        self.mem_mb = mem_mb
        self.roots = roots

    def setup(self) -> None: ...

    def dormant_paths(self, group: int) -> list[str]:
        """Files a new worker writes its pid into before it builds envs (none: empty)."""
        return []

    def active_paths(self) -> list[str]:
        """Files a process writes its pid into to join the active (unlimited) cgroup."""
        return []

    def memory_paths(self) -> list[str]:
        """Files a process writes its pid into to share the awake workers' memory limit
        (rlpipe.supervisor.memory) without joining their CPU weight: the random-return probe.
        In the `active` cpu cgroup, whose weight is that of all the workers, the probe (then at
        nice 10) alone on the PPO update's CPU took 0.25-0.29 of it, against 0.18-0.19 outside
        it (docs/benchmarks.md, "The probe's CPU cgroup"); it now runs under SCHED_IDLE."""
        return []

    def wake(self, group: int, pid: int) -> None: ...

    def hibernate(self, group: int, pid: int) -> None: ...

    def yield_to_learner(self) -> bool:
        """Weigh all the run's workers together as about one low-priority task
        (LEARNER_FIRST_SHARES); False where that cannot be done (no cgroup driver, or the
        write failed, said in the log): the caller pins them off the learner's CPU instead."""
        return False

    def cleanup(self) -> None: ...


class CgroupV1(CgroupDriver):
    name = "v1"
    CONTROLLERS = ("cpu", "memory")

    def _dir(self, controller: str, leaf: str = "") -> Path:
        d = self.roots.v1 / controller / f"rlpipe_{self.run_id}"
        return d / leaf if leaf else d

    def setup(self) -> None:
        for c in self.CONTROLLERS:
            self._dir(c).mkdir(exist_ok=True)
            self._dir(c, "active").mkdir(exist_ok=True)
        # CFS weighs a cgroup as one entity: at the default 1024 shares every woken worker
        # together would weigh as much as one driver thread. Weigh the run's cgroup and
        # `active` in it as the workers they hold.
        shares = str(min(SHARES_MAX, SHARES_DEFAULT * self.n_groups))
        _write(self._dir("cpu") / "cpu.shares", shares)
        _write(self._dir("cpu", "active") / "cpu.shares", shares)
        if self.active_mem_mb:  # rlpipe.supervisor.memory
            _write(self._dir("memory", "active") / "memory.limit_in_bytes", str(self.active_mem_mb * 2**20))

    def _group(self, group: int) -> None:
        cpu, mem = self._dir("cpu", f"g{group}"), self._dir("memory", f"g{group}")
        if not cpu.exists():
            cpu.mkdir()
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(CPU_PERIOD_US * self.cpu_pct / 100))))
        if not mem.exists():
            mem.mkdir()
            _write(mem / "memory.limit_in_bytes", str(self.mem_mb * 2**20))

    def dormant_paths(self, group: int) -> list[str]:
        self._group(group)
        return [str(self._dir(c, f"g{group}") / "cgroup.procs") for c in self.CONTROLLERS]

    def active_paths(self) -> list[str]:
        return [str(self._dir(c, "active") / "cgroup.procs") for c in self.CONTROLLERS]

    def memory_paths(self) -> list[str]:
        return [str(self._dir("memory", "active") / "cgroup.procs")]

    def wake(self, group: int, pid: int) -> None:
        for path in self.active_paths():
            _write(Path(path), str(pid))

    def hibernate(self, group: int, pid: int) -> None:
        for path in self.dormant_paths(group):
            _write(Path(path), str(pid))

    def yield_to_learner(self) -> bool:
        return _set_weight(self._dir("cpu") / "cpu.shares", LEARNER_FIRST_SHARES)

    def cleanup(self) -> None:
        for c in self.CONTROLLERS:
            _remove_tree(self._dir(c))


class CgroupV2(CgroupDriver):
    name = "v2"

    def _dir(self, leaf: str = "") -> Path:
        d = self.roots.v2 / f"rlpipe_{self.run_id}"
        return d / leaf if leaf else d

    def setup(self) -> None:
        self._dir().mkdir(exist_ok=True)
        _write(self._dir() / "cgroup.subtree_control", "+cpu +memory")
        self._dir("active").mkdir(exist_ok=True)
        # As for v1's cpu.shares: the woken workers together weigh as many processes.
        weight = str(min(WEIGHT_MAX, WEIGHT_DEFAULT * self.n_groups))
        _write(self._dir() / "cpu.weight", weight)
        _write(self._dir("active") / "cpu.weight", weight)
        if self.active_mem_mb:  # rlpipe.supervisor.memory
            _write(self._dir("active") / "memory.max", str(self.active_mem_mb * 2**20))

    def dormant_paths(self, group: int) -> list[str]:
        d = self._dir(f"g{group}")
        if not d.exists():
            d.mkdir()
            quota = max(1000, int(CPU_PERIOD_US * self.cpu_pct / 100))
            _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            _write(d / "memory.max", str(self.mem_mb * 2**20))
        return [str(d / "cgroup.procs")]

    def active_paths(self) -> list[str]:
        return [str(self._dir("active") / "cgroup.procs")]

    def memory_paths(self) -> list[str]:
        # one hierarchy: the memory limit comes with the workers' CPU weight (a cgroup that
        # holds processes, as `active` does, can have no child with controllers of its own)
        return self.active_paths()

    def wake(self, group: int, pid: int) -> None:
        _write(self._dir("active") / "cgroup.procs", str(pid))

    def hibernate(self, group: int, pid: int) -> None:
        for path in self.dormant_paths(group):
            _write(Path(path), str(pid))

    def yield_to_learner(self) -> bool:
        return _set_weight(self._dir() / "cpu.weight", LEARNER_FIRST_WEIGHT)

    def cleanup(self) -> None:
        _remove_tree(self._dir())


def _set_weight(path: Path, value: int) -> bool:
    try:
        _write(path, str(value))
    except OSError as exc:
        log.warning("weighing the workers below the learner failed (%s: %s); they leave its CPU instead", path, exc)
        return False
    return True


def _remove_tree(top: Path) -> None:
    """rmdir a cgroup tree bottom-up (cgroup dirs are removed with rmdir, never unlink);
    tasks still inside (a worker not yet reaped) are moved to the parent first."""
    for _listing in range(10):
        if not top.exists():
            return
        try:
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]
            break
        except FileNotFoundError:  # another driver (a torchrun rank beside us) sweeps the same tree
            time.sleep(0.02)
    else:
        return
    for d in dirs:
        for _attempt in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                _evacuate(d, top.parent)
                time.sleep(0.02)
        else:
            log.warning("could not remove cgroup %s", d)


def _evacuate(d: Path, parent: Path) -> None:
    procs = d / "cgroup.procs"
    try:
        pids = procs.read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            (parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass


def sweep_dead_cgroups(roots: CgroupRoots) -> list[Path]:
    """Remove rlpipe cgroup dirs left by runs whose driver pid is gone."""
    removed = []
    candidates = [roots.v2] + [roots.v1 / c for c in CgroupV1.CONTROLLERS]
    for base in candidates:
        if not base.is_dir():
            continue
        for d in base.glob("rlpipe_*"):
            m = _RUN_DIR_RE.match(d.name)
            if m is None:
                continue
            if pid_alive(int(m.group(1))):
                continue
            _remove_tree(d)
            removed.append(d)
    return removed


def make_driver(
    mode: str,
    run_id: str,
    cpu_pct: float,
    mem_mb: int,
    roots: CgroupRoots | None = None,
    n_groups: int = 1,
    active_mem_mb: int | None = None,
) -> CgroupDriver:
    """The cgroup driver for `groups.cgroup` (auto|v2|v1|none); auto falls back to none with
    one log line naming what was missing."""
    roots = roots or CgroupRoots.detect()
    sweep_dead_cgroups(roots)
    if mode in ("auto", "v2") and _v2_usable(roots.v2):
        cls = CgroupV2
    elif mode in ("auto", "v1") and _v1_usable(roots.v1):
        cls = CgroupV1
    elif mode == "none":
        cls = CgroupDriver
    else:
        what = {
            "auto": "neither a cgroup v2 hierarchy with cpu+memory delegated nor writable v1 "
            "cpu and memory hierarchies",
            "v2": f"no writable cgroup v2 hierarchy with cpu+memory at {roots.v2}",
            "v1": f"no writable cgroup v1 cpu and memory hierarchies under {roots.v1}",
        }[mode]
        log.warning("groups.cgroup=%s: %s; dormant groups run unlimited (cgroup driver: none)", mode, what)
        cls = CgroupDriver
    driver = cls(run_id, cpu_pct, mem_mb, roots, n_groups, active_mem_mb)
    try:
        driver.setup()
    except OSError as exc:
        log.warning(
            "groups.cgroup=%s: setting up %s cgroups failed (%s); dormant groups run unlimited (cgroup driver: none)",
            mode,
            cls.name,
            exc,
        )
        driver.cleanup()
        driver = CgroupDriver(run_id, cpu_pct, mem_mb, roots)
    return driver
