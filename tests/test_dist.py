"""DD-PPO across torchrun ranks (rlpipe.ranks): shares, config errors, the collectives of an
update with two gloo ranks, and whole 2-rank jobs under torchrun (ids, segments, a rank
killed mid-run)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, compose_cfg
from rlpipe.config import ConfigError, run_spec
from rlpipe.ranks import RankInfo, rank_from_env, rank_spec, share

TORCHRUN = Path(sys.executable).parent / "torchrun"


# -- shares and config ------------------------------------------------------------------------


def test_shares_tile_env_ids_and_remainders_go_to_the_first_ranks():
    for total, world in [(64, 2), (65, 2), (7, 3), (100, 7), (3, 3)]:
        parts = [share(total, world, r) for r in range(world)]
        assert sum(n for n, _ in parts) == total
        ids = [i for n, off in parts for i in range(off, off + n)]
        assert ids == list(range(total))  # globally unique, no gap
        assert [n for n, _ in parts] == sorted((n for n, _ in parts), reverse=True)
        assert max(n for n, _ in parts) - min(n for n, _ in parts) <= 1


def test_rank_spec_splits_envs_and_update_envs():
    spec = run_spec(compose_cfg(["env_count=65", "learner.update_envs=64"]))
    r0 = rank_spec(spec, RankInfo(0, 2, 0, "t", 0))
    r1 = rank_spec(spec, RankInfo(1, 2, 1, "t", 0))
    assert (r0.env_count, r0.env_id_offset, r1.env_count, r1.env_id_offset) == (33, 0, 32, 33)
    assert r0.learner.update_envs + r1.learner.update_envs == 64
    assert not r0.run.resume and rank_spec(spec, RankInfo(0, 2, 0, "t", 1)).run.resume  # a restart resumes


def test_rank_from_env():
    assert rank_from_env({}) is None
    info = rank_from_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "j"})
    assert (info.rank, info.world_size, info.local_rank, info.job_id, info.restart) == (1, 4, 1, "j", 0)
    with pytest.raises(ConfigError, match="RANK=4"):
        rank_from_env({"RANK": "4", "WORLD_SIZE": "4"})


@pytest.mark.parametrize(
    "override, key",
    [
        ("dist.sync_frac=2", "dist.sync_frac"),
        ("dist.sync_frac=0", "dist.sync_frac"),
        ("dist.backend=mpi", "dist.backend"),
        ("dist.timeout_s=-1", "dist.timeout_s"),
    ],
)
def test_bad_dist_values_are_one_paragraph_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        run_spec(compose_cfg([override]))
    assert key in str(err.value) and "\n" not in str(err.value)


def test_too_few_envs_for_the_ranks_is_a_config_error():
    spec = run_spec(compose_cfg(["env_mix=classic", "env_count=7"]))
    with pytest.raises(ConfigError, match="env_count=7"):
        rank_spec(spec, RankInfo(0, 2, 0, "t", 0))


def test_bad_sync_frac_on_the_command_line_exits_non_zero(short_tmp):
    out = subprocess.run(
        [sys.executable, "-m", "rlpipe", f"hydra.run.dir={short_tmp}", "dist.sync_frac=2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "dist.sync_frac=2" in out.stderr and "Traceback" not in out.stderr


class _Store:
    """torchrun's store as the round barrier uses it (add, delete_key), in one process."""

    def __init__(self):
        self.kv = {}

    def add(self, key, amount):
        self.kv[key] = self.kv.get(key, 0) + amount
        return self.kv[key]

    def delete_key(self, key):
        return self.kv.pop(key, None) is not None


def test_rounds_start_when_sync_frac_of_ranks_are_ready_and_stragglers_are_preempted(monkeypatch):
    from rlpipe.ranks import sync

    monkeypatch.setattr(sync, "POLL_S", 0.0)
    store = _Store()
    ranks = [sync.Rounds(store, r, 4, 0.6) for r in range(4)]
    assert ranks[0].need == 3  # ceil(0.6 x 4)
    assert not any(r.due(have_rollout=r.rank < 2, want_stop=False) for r in ranks)  # 2 of 4 ready
    assert ranks[2].due(have_rollout=True, want_stop=False)  # the third: the round starts...
    assert ranks[3].due(have_rollout=False, want_stop=False)  # ...for the straggler too
    had = [r.begin() for r in ranks]
    assert had == [True, True, True, False]  # rank 3 joins preempted
    assert all(r.round == 1 for r in ranks)
    assert not any(r.due(have_rollout=False, want_stop=False) for r in ranks)  # round 1 waits
    assert ranks[1].due(have_rollout=False, want_stop=True)  # a rank that must stop starts it...
    assert all(r.due(have_rollout=False, want_stop=False) for r in ranks)  # ...everywhere
    one = sync.Rounds(_Store(), 0, 2, 0.6)
    assert one.need == 2  # two ranks: 0.6 means both


# -- the collectives of an update: two gloo ranks ----------------------------------------------

UPDATE_SIZES = [(120, 80), (0, 60), (97, 0), (5, 3)]  # samples per rank per update


def _plan_and_spec(overrides):
    from rlpipe.envs.registry import plan_mix

    spec = run_spec(compose_cfg(["env_mix=classic", "env_count=8", *overrides]))
    return spec, plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)


def _batch(policy, plan, n: int, seed: int) -> dict:
    from rlpipe.ranks.learner import empty_batch

    if n == 0:
        return empty_batch(plan, torch.device("cpu"), False)
    g = torch.Generator().manual_seed(seed)
    obs = {k.name: torch.randn((n,) + k.shape, generator=g) for k in plan.obs_keys}
    types = torch.randint(0, len(plan.names), (n,), generator=g)
    a_disc = torch.zeros(n, dtype=torch.int64)
    a_cont = torch.rand((n, max(plan.actions.cont_dim, 1)), generator=g) * 2 - 1
    with torch.no_grad():
        logp, _, v = policy.evaluate(obs, types, a_disc, a_cont)
        value = policy.popart.denormalize(v, types).float()
    adv = torch.randn(n, generator=g) * 3
    # returns on very different scales per type: PopArt's statistics move visibly
    ret = value + adv + types.float() * 50
    return {
        "obs": obs,
        "types": types,
        "a_disc": a_disc,
        "a_cont": a_cont,
        "logp": logp.float(),
        "value": value,
        "adv": adv,
        "ret": ret,
    }


def _rank_main(rank: int, world: int, init_file: str, out_dir: str, overrides: list, sizes: list) -> None:
    import torch.distributed as dist

    from rlpipe.learner.policy import Policy
    from rlpipe.learner.ppo import ppo_update
    from rlpipe.learner.type_settings import TypeSettings
    from rlpipe.ranks.run import state_checksums
    from rlpipe.ranks.sync import RankSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    spec, plan = _plan_and_spec(overrides)
    torch.manual_seed(rank)  # different inits: the start-up broadcast is not what syncs here
    policy = Policy(plan, plan.obs_keys, spec.learner.hidden, spec.learner.cnn_channels, spec.learner.cnn_out)
    box = [policy.state_dict() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    policy.load_state_dict(box[0])
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3, eps=1e-5)
    sync = RankSync(rank, world, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1000 + rank)
    digests = []

    class Probe:  # what state_checksums reads of a learner
        pass

    probe = Probe()
    probe.policy, probe._optimizer, probe.round_steps = policy, opt, 0
    probe.counters = type("C", (), {"updates": 0})()
    for u, per_rank in enumerate(sizes):
        batch = _batch(policy, plan, per_rank[rank], seed=10 * u + rank)
        ppo_update(
            policy, opt, batch, spec.learner, gen, sync=sync, per_type=TypeSettings.of(spec.learner, spec.env_types)
        )
        probe.counters.updates = u + 1
        digests.append(state_checksums(probe))
    torch.save(
        {
            "digests": digests,
            "collectives": sync.collectives,
            "state": policy.state_dict(),
            "mu": policy.popart.mu.clone(),
        },
        Path(out_dir) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


def _spawn_two(tmp_path, overrides, sizes):
    """Two ranks forked from the test process (no second interpreter start-up to wait for)."""
    import torch.multiprocessing as tmp_mp

    init = tmp_path / "pg_init"
    tmp_mp.start_processes(
        _rank_main, args=(2, str(init), str(tmp_path), overrides, sizes), nprocs=2, join=True, start_method="fork"
    )
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_two_gloo_ranks_stay_bit_identical_over_unequal_and_empty_batches(tmp_path):
    """Five updates with batches of different sizes on each rank (one rank empty twice, one
    with fewer samples than minibatches): after every update the parameters, PopArt buffers
    and optimizer state hash the same on both ranks, and both made the same collective calls."""
    r0, r1 = _spawn_two(
        tmp_path, ["learner.minibatch_size=48", "learner.epochs=2", "learner.hidden=[16]"], UPDATE_SIZES
    )
    assert r0["digests"] == r1["digests"]
    assert r0["collectives"] == r1["collectives"] > len(UPDATE_SIZES)
    # the statistics moved with the batch: PopArt is not trivially in sync at (0, 1)
    assert float(r0["mu"].abs().max()) > 1.0


@pytest.mark.parametrize(
    "per_type",
    [
        (),
        (
            "learner.ent_coef=0.0",
            "+env_mix.types.cartpole.learner.ent_coef=0.05",
            "+env_mix.types.pendulum.learner.popart_beta=0.01",
        ),
    ],
)
def test_two_ranks_take_the_step_one_process_takes_on_the_union_batch(tmp_path, per_type):
    """One epoch, one minibatch: the sample-weighted gradient mean over ranks, PopArt and
    per-type advantage statistics from both ranks' batches make the update of one process
    on the two batches concatenated (to float rounding); with env types' own entropy bonus
    and PopArt step (env nodes' `learner:`) too."""
    from rlpipe.learner.policy import Policy
    from rlpipe.learner.ppo import ppo_update
    from rlpipe.learner.type_settings import TypeSettings

    overrides = ["learner.minibatch_size=100000", "learner.epochs=1", "learner.hidden=[16]", *per_type]
    sizes = [(120, 50)]
    r0, _r1 = _spawn_two(tmp_path, overrides, sizes)
    spec, plan = _plan_and_spec(overrides)
    torch.manual_seed(0)  # rank 0's init, which the ranks broadcast
    policy = Policy(plan, plan.obs_keys, spec.learner.hidden, spec.learner.cnn_channels, spec.learner.cnn_out)
    parts = [_batch(policy, plan, n, seed=r) for r, n in enumerate(sizes[0])]
    union = {
        k: (
            {kk: torch.cat([p[k][kk] for p in parts]) for kk in parts[0][k]}
            if k == "obs"
            else torch.cat([p[k] for p in parts])
        )
        for k in parts[0]
    }
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3, eps=1e-5)
    ppo_update(
        policy,
        opt,
        union,
        spec.learner,
        torch.Generator().manual_seed(0),
        per_type=TypeSettings.of(spec.learner, spec.env_types),
    )
    for name, value in policy.state_dict().items():
        assert torch.allclose(value, r0["state"][name], rtol=1e-4, atol=1e-5), name


# -- whole jobs under torchrun -------------------------------------------------------------------


def _stop_group(proc: subprocess.Popen) -> None:
    """A job a failed test leaves running: SIGTERM (each rank tears down), SIGKILL if stuck."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def torchrun_temp_dirs() -> set[Path]:
    """torchrun's per-job directories in the temp dir (made when no --log-dir is given)."""
    return set(Path(tempfile.gettempdir()).glob("torchelastic_*"))


def _rank_pids(torchrun_pid: int) -> dict[int, int]:
    """rank -> driver pid of a running torchrun job (from the children's environments)."""
    import psutil

    found = {}
    for child in psutil.Process(torchrun_pid).children():
        try:
            env = child.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = child.pid
    return found


def _env_rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT run_id, env_id FROM events WHERE kind = 'env_create'").fetchall()


def _alive(pids) -> list[int]:
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_rank_killed_mid_run_ends_the_job_clearly_without_orphans_and_ids_never_collide(short_tmp):
    """Two ranks step disjoint global env ids in segments of their own; SIGKILL rank 1's
    driver: torchrun names it, rank 0 says why it stops, and no process, segment or socket
    dir of the job is left."""
    run = short_tmp / "run"  # removed by the fixture whatever happens
    elastic_before = torchrun_temp_dirs()
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node=2",
        f"--log-dir={short_tmp / 'torchrun'}",
        "-m",
        "rlpipe",
        f"hydra.run.dir={run}",
        "env_count=12",
        "groups.size=3",
        "run.duration_s=300",
        "run.total_env_steps=10000000",
        "logging.random_return_episodes=0",
        "logging.progress_interval_s=1",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        rows: list = []
        while time.monotonic() < deadline and proc.poll() is None:
            dbs = [run / "lifecycle.sqlite", run / "rank1" / "lifecycle.sqlite"]
            if all(db.exists() for db in dbs):
                try:
                    rows = [_env_rows(db) for db in dbs]
                except sqlite3.Error:  # a file the driver has not yet given its schema
                    rows = []
                # `rows` must be non-empty: all() of nothing is true, and a read that failed
                # once broke the loop with no rows (a CI run failed so).
                if rows and all(len(r) == 6 for r in rows):
                    break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert rows and all(len(r) == 6 for r in rows), rows
        ranks = _rank_pids(proc.pid)
        assert set(ranks) == {0, 1}
        # env ids: rank 0 owns 0..5, rank 1 owns 6..11; run ids (segment and key prefixes) differ
        assert sorted(e for _, e in rows[0]) == list(range(6))
        assert sorted(e for _, e in rows[1]) == list(range(6, 12))
        with sqlite3.connect(dbs[1]) as con:  # rank 1's creates are spans against its layout at its offset
            assert con.execute("SELECT COUNT(*) FROM event_rows WHERE kind = 'env_create'").fetchone() == (0,)
        run_ids = [{rid for rid, _ in r} for r in rows]
        assert len(run_ids[0]) == len(run_ids[1]) == 1 and run_ids[0] != run_ids[1]
        assert next(iter(run_ids[0])).endswith("r0") and next(iter(run_ids[1])).endswith("r1")
        segs = [sorted(p.name for p in Path("/dev/shm").glob(f"rlpipe_{ranks[r]}-*")) for r in (0, 1)]
        assert segs[0] and segs[1] and not set(segs[0]) & set(segs[1])
        tree = _descendants(proc.pid)
        time.sleep(3.0)  # a few update rounds go through first
        os.kill(ranks[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        _stop_group(proc)
    assert proc.returncode != 0
    assert "rank      : 1" in out and "SIGKILL" in out, out[-3000:]
    assert "rlpipe rank 0/2: SIGTERM received, stopping" in out or "rlpipe: rank 0/2" in out, out[-3000:]
    deadline = time.monotonic() + 20  # forkservers and workers go on their own, shortly after
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(tree) == [], [(p, open(f"/proc/{p}/cmdline").read()) for p in _alive(tree)]
    for pid in ranks.values():
        assert not list(Path("/dev/shm").glob(f"rlpipe_{pid}-*"))
        assert not list(Path("/tmp").glob(f"rlpipe_{pid}-*"))
    assert torchrun_temp_dirs() <= elastic_before  # torchrun's files went under short_tmp


def test_two_rank_job_killed_rank_restarts_resumes_and_ends_in_sync(short_tmp):
    """torchrun --max-restarts=1: rank 1 is SIGKILLed once both ranks have checkpointed; the
    restart finds the same run directory, resumes each rank from its checkpoints (rank 0's
    learner state broadcast), and ends with exit 0, world_size 2 and every checksum equal
    (measured), env steps and SPS summed over ranks in rank 0's summary, rank 1's outputs
    under rank1/, nothing of either attempt left in /dev/shm."""
    run = short_tmp / "run"  # removed by the fixture whatever happens
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node=2",
        "--max-restarts=1",
        f"--log-dir={short_tmp / 'torchrun'}",
        "-m",
        "rlpipe",
        f"hydra.run.dir={run}",
        "env_count=8",
        "groups.size=4",
        "run.total_env_steps=12000",
        "run.duration_s=200",
        "learner.update_envs=8",
        "learner.checkpoint_interval_s=1",
        "logging.random_return_episodes=0",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 150
        while not all(list((d / "checkpoints").glob("ckpt_*.pt")) for d in (run, run / "rank1")):
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)  # each rank tears down
                out, _ = proc.communicate(timeout=60)
                raise AssertionError("no checkpoints on both ranks:\n" + out[-4000:])
            time.sleep(0.3)
        first = _rank_pids(proc.pid)
        os.kill(first[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        _stop_group(proc)
    assert proc.returncode == 0, out[-4000:]
    s0 = json.loads((run / "summary.json").read_text())
    s1 = json.loads((run / "rank1" / "summary.json").read_text())
    d = s0["dist"]
    assert d["world_size"] == 2 and d["params_in_sync"] is True
    assert all(d["state_in_sync"].values())
    assert s0["resumed_from_step"] > 0 and s1["resumed_from_step"] > 0
    assert s0["env_steps"] == sum(r["env_steps"] for r in d["ranks"]) >= 12000
    assert s0["sps"] == pytest.approx(sum(r["sps"] for r in d["ranks"]), abs=0.2)
    assert s1["dist"]["rank"] == 1 and s1["dist"]["params_in_sync"] is True
    assert s0["updates"] == s1["updates"] > 0
    assert (run / "tb").is_dir() and not (run / "rank1" / "tb").exists()
    for pid in [*first.values(), *(r["pid"] for r in d["ranks"])]:
        assert not list(Path("/dev/shm").glob(f"rlpipe_{pid}-*"))
