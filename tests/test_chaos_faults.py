"""The chaos faults' registry (rlpipe/chaos_faults.py): every registered fault has one setting,
off by default, the runner injects what the registry lists on its schedule, and the recovery
report judges every registered fault by its class's rule; the fault added last (a Redis
pause) injected and healed in a short real run."""

from __future__ import annotations

import dataclasses
import os
import signal
import uuid
from pathlib import Path
from types import SimpleNamespace

from conftest import compose_cfg
from rlpipe.chaos_faults import BY_WHAT, FAULTS, FreezeDriver, ticked_faults
from rlpipe.config import ChaosSpec, run_spec
from rlpipe.lifecycle import EVENT_KINDS, LifecycleWriter
from rlpipe.lifecycle.recovery import recovery_report

T0 = 1_700_000_000.0


def _chaos(*overrides: str) -> ChaosSpec:
    return run_spec(compose_cfg(list(overrides))).chaos


def test_every_fault_has_one_setting_and_chaos_off_turns_it_off():
    """One ChaosSpec field per fault and one fault per field: switching a field on (from
    chaos=off) turns exactly its fault on."""
    off = _chaos()
    assert len(BY_WHAT) == len(FAULTS), "two faults share a `what`"
    assert [f.what for f in FAULTS if f.setting(off) is not None] == []
    assert not off.enabled
    owners = {}
    for field in dataclasses.fields(ChaosSpec):
        on = dataclasses.replace(off, **{field.name: 5.0})
        owners[field.name] = [f.what for f in FAULTS if f.setting(on) == 5.0]
        assert on.enabled == any(not f.in_loop for f in FAULTS if f.what in owners[field.name])
    assert all(len(v) == 1 for v in owners.values()), owners
    assert sorted(w for v in owners.values() for w in v) == sorted(BY_WHAT), owners


def test_chaos_on_is_day5s_schedule_over_chaos_off():
    on = _chaos("chaos=on")
    assert [f.what for f in ticked_faults(on)] == ["kill_worker", "stop_worker", "kill_redis"]
    assert on.freeze_driver_at_s is None and on.enabled
    assert dataclasses.asdict(_chaos("+stage=day5")) == dataclasses.asdict(on)


def _write(db_path: Path, write) -> None:
    w = LifecycleWriter(db_path, f"inproc://lc-{uuid.uuid4().hex}", run_id="faults")
    w.start()
    write(w.record)
    w.stop()
    assert w.bad_messages == 0


def test_the_recovery_report_judges_every_registered_fault(tmp_path: Path):
    """Each registered fault, in a log of its own, injected twice: the first healed by the row
    its rule names (a stale row of the injected generation before it must not count), the
    second never (a `one_each` row heals one injection only, a worker fault needs a generation
    above the one it hit); an unregistered `what` never heals."""
    for k, fault in enumerate(FAULTS):
        rule = fault.healed_by
        assert rule.kind in EVENT_KINDS, f"{fault.what}: nothing emits {rule.kind!r}"

        def write(rec, k=k, fault=fault, rule=rule):  # bound now: called in this iteration
            who = dict(worker_id=k, generation=1) if rule.newer_generation else {}
            rec("chaos_inject", detail={"what": fault.what, "t": 0.0}, ts=T0, **who)
            if rule.newer_generation:
                rec(rule.kind, worker_id=k, generation=1, ts=T0 + 0.5)
                rec(rule.kind, worker_id=k, generation=2, ts=T0 + 2.0)
            else:
                rec(rule.kind, ts=T0 + 2.0)
            rec(
                "chaos_inject",
                detail={"what": fault.what, "t": 10.0},
                ts=T0 + 10,
                **(dict(worker_id=k, generation=2) if rule.newer_generation else {}),
            )
            rec("chaos_inject", detail={"what": "not_a_fault"}, ts=T0 + 20)

        db = tmp_path / fault.what / "lifecycle.sqlite"
        db.parent.mkdir()
        _write(db, write)
        rep = recovery_report(db, summary={"env_steps": 1000, "env_count": 10, "wall_s": 100})
        first, second = [e for e in rep["events"] if e["what"] == fault.what]
        assert first["recover_s"] == 2.0, (fault.what, first)
        assert first["recovered_by"] == (f"{rule.kind} gen 2" if rule.newer_generation else rule.kind)
        if rule.newer_generation or rule.one_each:
            assert second["recover_s"] is None, (fault.what, second)
        assert rep["by_kind"][fault.what]["injected"] == 2
        assert rep["by_kind"]["not_a_fault"] == {"injected": 1, "recovered": 0, "p50_s": None, "p99_s": None}
        # no worker_spawn rows: a fault that costs stepping counts 0 envs, the others nothing
        assert rep["lost_env_steps_est"] == 0


class _Proc:
    def __init__(self, pid: int):
        self.pid, self.dead = pid, False

    def poll(self):
        return 0 if self.dead else None

    def kill(self):
        self.dead = True


class _Handle:
    def __init__(self, k: int):
        self.worker_id, self.generation, self.awake, self.proc = k, 1, True, _Proc(1000 + k)
        self.stepped = True

    def alive(self) -> bool:
        return True


def test_the_runner_injects_the_registered_faults_on_their_schedule(monkeypatch):
    """kill every 2 s and stop every 3 s from the fleet's start, the Redis kill once 5 s after
    it; nothing before the start, nothing after quiet_from. Signals are recorded, not sent."""
    from rlpipe.supervisor import chaos as runner

    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(signal.Signals(sig).name))
    monkeypatch.setattr(runner, "live_pids", set)  # the fake pids stay "alive"
    rows, quiet = [], []
    services = SimpleNamespace(
        lifecycle=SimpleNamespace(
            record=lambda kind, detail, **f: (quiet if kind == "chaos_quiet" else rows).append(detail)
        ),
        redis=SimpleNamespace(proc=_Proc(1)),
    )
    spec = _chaos("chaos.kill_worker_every_s=2", "chaos.stop_worker_every_s=3", "chaos.kill_redis_at_s=5")
    chaos = runner.Chaos(spec, seed=0, t0=90.0, services=services, pending={}, quiet_from=109.0)
    handles = [_Handle(k) for k in range(8)]  # the fakes are never replaced: one per fault
    chaos.tick(handles, 99.0)  # the fleet is not up yet: nothing is due
    chaos.start(100.0)
    for i in range(121):
        chaos.tick(handles, 100.0 + i * 0.1)
    # `t` counts from the run's start (90), the schedule from the fleet's (100)
    assert [(d["what"], d["t"]) for d in rows] == [
        ("kill_worker", 12.0),
        ("stop_worker", 13.0),
        ("kill_worker", 14.0),
        ("kill_redis", 15.0),
        ("kill_worker", 16.0),
        ("stop_worker", 16.0),
        ("kill_worker", 18.0),
    ]
    assert sent == ["SIGKILL", "SIGSTOP", "SIGKILL", "SIGKILL", "SIGSTOP", "SIGKILL"]  # Redis: Popen.kill
    assert services.redis.proc.dead and chaos.injected == 7
    # no worker has been ready, so no heal time: the quiet end is quiet_from itself
    assert quiet == [{"t": 19.0, "heal_s": 0.0, "heal_s_of": "fleet start"}]
    # a replacement still building is no target, nor a worker already struck: the fault its
    # replacement heals and a new one would be one restart
    building = _Handle(9)
    building.stepped = False
    struck = [h for h in handles if h.proc.pid in chaos.hit]
    assert len(struck) == 6  # no worker struck twice: its replacement heals one fault
    ready = next(h for h in handles if h not in struck)
    assert chaos.target([building, *struck]) is None
    assert chaos.target([building, *struck, ready]) is ready


def test_a_due_fault_with_no_target_strikes_at_the_first_tick_that_has_one(monkeypatch):
    """Every worker still rebuilding when a kill is due: the kill waits for the first stepped
    worker instead of a whole interval, and the next kill counts from when it struck."""
    from rlpipe.supervisor import chaos as runner

    monkeypatch.setattr(os, "kill", lambda pid, sig: None)
    rows = []
    services = SimpleNamespace(lifecycle=SimpleNamespace(record=lambda kind, detail, **f: rows.append(detail)))
    chaos = runner.Chaos(_chaos("chaos.kill_worker_every_s=5"), seed=0, t0=0.0, services=services, pending={})
    worker = _Handle(0)
    worker.stepped = False  # a replacement still building
    chaos.start(0.0)
    for now in (5.0, 5.5, 6.0):
        chaos.tick([worker], now)
    assert rows == []
    worker.stepped = True
    for now in (6.5, 7.0):
        chaos.tick([worker], now)
    replacement = _Handle(1)  # a new process, stepped
    for now in (11.0, 11.5):
        chaos.tick([replacement], now)
    assert [d["t"] for d in rows] == [6.5, 11.5]


def test_the_quiet_end_leaves_a_replacements_heal_time_not_the_fleets_start():
    """The fleet's start (every worker at once, 16 s on a loaded machine) stands in for the
    heal time until a replacement is ready; from then on the replacements' longest counts, so
    a slow start does not silence the rest of a short run."""
    from rlpipe.supervisor import chaos as runner

    services = SimpleNamespace(lifecycle=SimpleNamespace(record=lambda kind, detail, **f: None))
    chaos = runner.Chaos(_chaos(), seed=0, t0=0.0, services=services, pending={}, quiet_from=38.0)
    for since in (16.0, 12.0):
        chaos.worker_ready(since, replacement=False)
    assert chaos.heal_s == 16.0  # nothing healed yet: the pessimistic guess
    chaos.worker_ready(2.5, replacement=True)
    chaos.worker_ready(16.5, replacement=False)  # a late first worker no longer counts
    assert chaos.heal_s == 2.5
    chaos.worker_ready(3.1, replacement=True)
    chaos.worker_ready(1.0, replacement=True)
    assert chaos.heal_s == 3.1


def test_the_driver_freezes_after_its_first_checkpoint_unless_resumed():
    spec = _chaos("chaos.freeze_driver_at_s=4")
    assert FreezeDriver.due_at(spec, 50.0, resumed=False) == 54.0
    assert FreezeDriver.due_at(spec, 50.0, resumed=True) is None
    assert FreezeDriver.due_at(_chaos(), 50.0, resumed=False) is None


def test_a_redis_pause_in_a_real_run_is_healed_in_the_recovery_report(short_tmp):
    """chaos.pause_redis_at_s in a short real run (16 CartPoles, 2 workers, the real embedded
    Redis): the server is SIGSTOPped, continued PAUSE_S later, and the recovery report finds
    the `redis_recovered` row once both workers beat into it again. A pause is not a dead
    worker (Redis down is never read as one) and the run ends clean."""
    from conftest import read_summary, run_cli, run_leftovers
    from rlpipe.chaos_faults import PauseRedis

    run_dir = short_tmp / "run"
    out = run_cli(
        run_dir,
        "env_count=16",
        "groups.size=8",
        # chaos is quiet for the last 8 s (timeout_s + term_grace_s + 2 scans) and the longest
        # worker start seen; its clock starts once both workers stepped (a few seconds in, 15 s
        # beside two CPU-bound runs), and the pause is due 1 s after: 28 s leaves room for both
        "run.duration_s=28",
        "run.total_env_steps=null",
        "chaos.pause_redis_at_s=1",
        "learner.mode=random",  # what heals is Redis: no PPO updates to pay for over 28 s
        "heartbeat.timeout_s=6",  # twice the pause
        "heartbeat.scan_interval_s=0.5",
        "heartbeat.redis_interval_s=0.5",
        "heartbeat.signal_interval_s=0.2",
        "heartbeat.term_grace_s=1",
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rep = recovery_report(run_dir / "lifecycle.sqlite")
    assert rep["by_kind"].keys() == {"pause_redis"} and rep["unrecovered"] == 0, rep
    (event,) = rep["events"]
    assert event["recovered_by"] == "redis_recovered"
    assert event["recover_s"] >= PauseRedis.PAUSE_S  # healed after the SIGCONT, not before
    assert read_summary(run_dir)["faults"]["worker_restarts"] == 0
    assert "every injected fault recovered: **yes**" in (run_dir / "health_report.md").read_text()
    assert run_leftovers(out.pid) == []
