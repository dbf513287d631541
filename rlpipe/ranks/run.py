"""One rank's part of a torchrun job, as the driver sees it (the `Ranks` run mode of
rlpipe.supervisor.runmode): the process group, the run directory every rank agrees on, the
learner and TensorBoard writer of this rank, stopping and checkpointing after the update
round that says so, and the end-of-run check that all ranks hold the same learner state
(measured by checksums, never assumed)."""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist

from rlpipe.config import RunSpec
from rlpipe.envs import random_return
from rlpipe.ranks import RankInfo, rank_spec
from rlpipe.ranks.generation import AttemptToken
from rlpipe.ranks.sync import rank_lost
from rlpipe.shm.segment import new_run_id, sweep_dead_segments
from rlpipe.supervisor.runmode import RunMode
from rlpipe.supervisor.services import sweep_dead_socket_dirs

log = logging.getLogger("rlpipe.ranks")
ATTEMPTS_FILE = "attempts.jsonl"  # per rank dir: one line per attempt of the job that ran there


def resolve_backend(spec: RunSpec) -> str:
    if spec.dist.backend != "auto":
        return spec.dist.backend
    device = spec.learner.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "nccl" if device == "cuda" else "gloo"


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def local_address() -> str | None:
    """The address this host reaches rank 0's store from (its interface toward MASTER_ADDR: on
    rank 0's host, that address itself); None without MASTER_ADDR. No packet is sent."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "29500")
    if not host:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port)))
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return None


def state_checksums(learner) -> dict[str, str]:
    """sha256 of what must be equal on every rank: the policy's parameters, its PopArt
    buffers, the optimizer's state (moments and step counts per parameter, learning rate),
    and the schedule's inputs (global env steps at the last round, updates)."""
    policy = learner.policy
    params = [p for name, p in policy.named_parameters()]
    popart = [b for name, b in policy.named_buffers() if "popart" in name]
    other_buffers = [b for name, b in policy.named_buffers() if "popart" not in name]
    opt = learner._optimizer
    opt_tensors = []
    lr = []
    if opt is not None:
        for group in opt.param_groups:
            lr.append(float(group["lr"]))
            for p in group["params"]:
                for _key, value in sorted(opt.state.get(p, {}).items()):
                    opt_tensors.append(value if torch.is_tensor(value) else torch.tensor(float(value)))
    schedule = torch.tensor([float(learner.round_steps), float(learner.counters.updates)] + lr, dtype=torch.float64)
    return {
        "policy": _digest(params + other_buffers),
        "popart": _digest(popart),
        "optimizer": _digest(opt_tensors),
        "schedule": _digest([schedule]),
    }


class NullTb:
    """Ranks other than 0 write no TensorBoard events (rank 0 charts the job)."""

    def scalars(self, *a, **k):
        pass

    def histogram(self, *a, **k):
        pass

    def hparams(self, *a, **k):
        pass

    def text(self, *a, **k):
        pass

    def close(self):
        pass


class GlobalStepTb:
    """Rank 0's TensorBoard writer with the job's env steps on the x axis: the steps of all ranks at the
    last update round plus rank 0's own since (exact at each round, a lower bound between)."""

    def __init__(self, tb, learner):
        self.tb, self.learner = tb, learner

    def _step(self, step: int) -> int:
        return self.learner.round_steps + step - self.learner.local_at_round if step else step

    def scalars(self, step, values):
        self.tb.scalars(self._step(step), values)

    def histogram(self, tag, values, step):
        self.tb.histogram(tag, values, self._step(step))

    def text(self, tag, text, step=0):
        self.tb.text(tag, text, self._step(step))

    def hparams(self, hparams, metrics):
        self.tb.hparams(hparams, metrics)

    def close(self):
        self.tb.close()


class Ranks(RunMode):
    """Built by the app once per rank process (after the config validated): rank 0 writes
    the job's outputs, every rank its own under `rank<N>/`."""

    def __init__(self, info: RankInfo, spec: RunSpec):
        self.info = info
        self.rank, self.world = info.rank, info.world_size
        self.job_spec = spec
        self.spec = rank_spec(spec, info)  # ConfigError before any collective
        self.backend = resolve_backend(self.spec)
        self.writes_job_outputs = self.rank == 0
        self.line_prefix = f"rank {self.rank}/{self.world} "
        self.learner = None
        self.root: Path | None = None
        self.host = socket.gethostname()
        self.addr = local_address()

    def start(self, output_dir: Path) -> Path:
        self._init_process_group()
        run_dir = self._agree_run_dir(output_dir)
        self._resume_if_any_ran_before(run_dir)
        return run_dir

    def _resume_if_any_ran_before(self, run_dir: Path) -> None:
        """Every rank resumes (run.resume=auto) when any rank of this job ran before: torchrun's
        restart count does not say so on every node (a node that was lost and came back runs a
        new agent counting from 0; an agent restarting its ranks for a node that joined does not
        count at all), so each rank's run dir keeps a line per attempt of the job
        (`attempts.jsonl`: job id, host, address, pid) and the ranks all-reduce whether theirs
        held one already."""
        marker = run_dir / ATTEMPTS_FILE
        job = self.info.job_id
        seen = []
        if marker.exists():
            for line in marker.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    seen.append(json.loads(line))
        ran_before = self.info.restart > 0 or any(entry.get("job") == job for entry in seen)
        self.attempt = 1 + sum(entry.get("job") == job for entry in seen)
        with open(marker, "a") as out:
            entry = {"job": job, "host": self.host, "addr": self.addr, "pid": os.getpid(), "restart": self.info.restart}
            out.write(json.dumps({**entry, "unix_time": round(time.time(), 3)}) + "\n")
        flag = torch.tensor([float(ran_before)], dtype=torch.float64, device=self.sync_device)
        try:
            tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
        except Exception as exc:
            raise rank_lost(self.rank, self.world, "the start-up all-reduce of earlier attempts", exc) from exc
        self.job_restarted = flag.item() > 0
        if self.job_restarted and not self.spec.run.resume:
            self.spec = dataclasses.replace(self.spec, run=dataclasses.replace(self.spec.run, resume="auto"))

    def _init_process_group(self) -> None:
        """The process group, on a store prefix of this attempt's own: torchrun's agent keeps
        one store server across --max-restarts restarts, and the previous attempt's keys (the
        dead ranks' gloo addresses among them) would otherwise be read as fresh. The prefix is
        agreed with rank 0 (`AttemptToken`), not taken from torchrun's restart count, which a
        node that was lost and came back counts from 0 again."""
        if self.backend == "nccl":
            torch.cuda.set_device(self.info.local_rank)
        timeout = timedelta(seconds=self.spec.dist.timeout_s)
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            from torch.distributed.rendezvous import _create_c10d_store  # env:// does the same, unprefixed

            addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            base = _create_c10d_store(addr, port, self.rank, self.world, timeout)
            attempt = AttemptToken(
                base,
                lambda: tdist.TCPStore(addr, port, self.world, is_master=False, timeout=timeout),
                self.rank,
                self.world,
                self.info.job_id,
            )
            try:
                try:
                    prefix = f"rlpipe/{self.info.job_id}/{attempt.agree()}/"
                except Exception as exc:  # the store's timeout (dist.timeout_s), or no store
                    raise rank_lost(self.rank, self.world, "waiting for rank 0 to start this attempt", exc) from exc
                tdist.init_process_group(
                    self.backend,
                    store=tdist.PrefixStore(prefix + "pg/", base),
                    rank=self.rank,
                    world_size=self.world,
                    timeout=timeout,
                )
            finally:
                attempt.done()
        else:
            tdist.init_process_group(self.backend, timeout=timeout)
            from torch.distributed.distributed_c10d import _get_default_store

            base = _get_default_store()
            prefix = f"rlpipe/{self.info.job_id}/{self.info.restart}/"
        self.store = tdist.PrefixStore(prefix + "rounds/", base)
        log.info(
            "rank %d/%d up (%s backend, %d envs from env id %d)",
            self.rank,
            self.world,
            self.backend,
            self.spec.env_count,
            self.spec.env_id_offset,
        )

    @property
    def sync_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def _agree_run_dir(self, output_dir: Path) -> Path:
        """Rank 0's run directory, broadcast; rank N works in its `rank<N>/` subdirectory."""
        box = [str(output_dir)]
        try:
            tdist.broadcast_object_list(box, src=0)
        except Exception as exc:
            raise rank_lost(self.rank, self.world, "the broadcast of rank 0's run directory", exc) from exc
        self.root = Path(box[0])
        run_dir = self.root if self.rank == 0 else self.root / f"rank{self.rank}"
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir

    def new_run_id(self) -> str:
        return new_run_id(self.rank)

    def redis_fields(self) -> dict:
        return {
            "job": self.info.job_id,
            "rank": self.rank,
            "world_size": self.world,
            "env_id_offset": self.spec.env_id_offset,
        }

    def make_learner(self, spec: RunSpec, plan):
        from rlpipe.ranks.learner import RankLearner

        self.learner = RankLearner(spec, plan, self.rank, self.world, self.store, self.sync_device)
        return self.learner

    def start_learner(self, learner, resumed: bool) -> None:
        learner.start_in_sync(resumed)

    def make_tb(self, run_dir: Path, config_yaml: str | None):
        if self.rank != 0:
            return NullTb()
        from rlpipe.telemetry.tb import TbWriter

        return GlobalStepTb(TbWriter(run_dir, config_yaml), self.learner)

    # -- rounds ------------------------------------------------------------------------------
    def should_stop(self, learner, elapsed_s: float) -> bool:
        """Ranks stop together, after an update round that says so: run.duration_s passing on
        one rank asks for it; run.total_env_steps is the job's, counted at each round."""
        duration = self.spec.run.duration_s
        if duration and elapsed_s >= duration:
            learner.want_stop = True
        return learner.finished

    def checkpoint_after_update(self, learner) -> bool:
        return learner.take_checkpoint()  # every rank, right after the same round

    def checkpoint_on_clock(self, learner, timer, now: float) -> bool:
        learner.checkpoint_wanted = timer.passed(now)  # asked for in the next round's header
        return False

    # -- the end -----------------------------------------------------------------------------
    def join_update_in_flight(self, learner) -> None:
        if learner is not None:
            learner.join_for_teardown()

    def sweep_after_teardown(self) -> None:
        """A rank killed beside this one left its segments and socket dirs."""
        sweep_dead_segments()
        sweep_dead_socket_dirs()

    def say_stopping(self, signum: int) -> None:
        """One line the moment a signal stops this rank (torchrun sends SIGTERM to every rank
        when one fails, and SIGKILL after its grace period, maybe before our summary line)."""
        import signal as _signal

        name = _signal.Signals(signum).name
        why = (
            " torchrun stops every rank when one fails: its report names the rank;"
            if os.environ.get("TORCHELASTIC_RUN_ID")
            else ""
        )
        print(
            f"rlpipe rank {self.rank}/{self.world}: {name} received, stopping this rank (workers, Redis, "
            f"segments are removed).{why} run.resume=true continues from the checkpoints.",
            flush=True,
        )

    def summary_section(self) -> dict:
        """`summary.json` `dist` until the final exchange fills in the comparison."""
        return {
            "world_size": self.world,
            "rank": self.rank,
            "host": self.host,  # where this rank ran: the run dirs of a multi-node job say which
            "addr": self.addr,
            "restart": self.info.restart,  # this node's agent's count (a node that came back: 0)
            "attempt": getattr(self, "attempt", None),  # of this job in this rank's run dir, from 1
            "job_restarted": getattr(self, "job_restarted", None),  # any rank's: all resumed
            "backend": self.backend,
            "sync_frac": self.spec.dist.sync_frac,
            "env_id_offset": self.spec.env_id_offset,
            "run_root": str(self.root),
            "params_in_sync": None,
        }

    def finish_summary(self, result: dict, stop_signal: int | None, run_dir: Path) -> dict:
        ranks = self.final_exchange(result, stop_signal)
        starts = random_return.read_results(run_dir, random_return.INITIAL_FILE)
        return self.merge_summary(result, ranks, random_return.read_results(run_dir), starts)

    def final_exchange(self, result: dict, stop_signal: int | None) -> list[dict] | None:
        """All ranks' end figures and state checksums (all-gather), or None when the run was
        stopped by a signal: its peers may be gone, so no collective is attempted."""
        if stop_signal is not None:
            return None
        learner = self.learner
        mine = {
            "rank": self.rank,
            "host": self.host,
            "addr": self.addr,
            "pid": os.getpid(),
            "env_count": self.spec.env_count,
            "env_id_offset": self.spec.env_id_offset,
            "env_steps": result["env_steps"],
            "sps": result["sps"],
            "episodes": result["episodes"],
            "trained_samples": result["trained_samples"],
            "updates": result["updates"],
            "peak_rss_mb": result["peak_rss_mb"],
            "preempted_rounds": learner.preempted_rounds,
            "rounds": learner.rounds.round,
            "collectives": learner.sync.collectives,
            "collective_s": round(learner.sync.collective_s, 3),  # benchmarks/twohost_link.py
            "round_s": round(learner.round_s, 3),
            "returns": {k: list(v) for k, v in learner.counters.returns.items()},
            "first_returns": {k: list(v) for k, v in learner.counters.first_returns.items()},
            "episodes_by_type": dict(learner.counters.episodes_by_type),
            "checksums": state_checksums(learner),
        }
        box: list = [None] * self.world
        try:
            tdist.all_gather_object(box, mine)
        except Exception as exc:
            log.error("%s", rank_lost(self.rank, self.world, "the final all-gather of state checksums", exc))
            return None
        return box

    def merge_summary(self, result: dict, ranks: list[dict] | None, randoms: dict, starts: dict) -> dict:
        """This rank's summary with the `dist` section; rank 0's also carries the job's totals
        (env steps, SPS, episodes, trained samples summed over ranks; returns over every
        rank's last and first 100 episodes, and the learned verdicts from those)."""
        section = self.summary_section()
        if ranks is None:
            section["params_in_sync_note"] = "not measured: the run was stopped before the final check"
            result["dist"] = section
            return result
        components = {k: len({r["checksums"][k] for r in ranks}) == 1 for k in ranks[0]["checksums"]}
        section["params_in_sync"] = all(components.values())
        section["state_in_sync"] = components
        section["ranks"] = [
            {k: v for k, v in r.items() if k not in ("returns", "first_returns", "episodes_by_type")} for r in ranks
        ]
        section["hosts"] = [{"rank": r["rank"], "host": r["host"], "addr": r["addr"]} for r in ranks]
        if self.rank == 0:
            result["env_steps_rank0"] = result["env_steps"]
            result["env_steps"] = sum(r["env_steps"] for r in ranks)
            result["sps"] = round(sum(r["sps"] for r in ranks), 1)
            result["episodes"] = sum(r["episodes"] for r in ranks)
            result["trained_samples"] = sum(r["trained_samples"] for r in ranks)
            result["env_count"] = self.job_spec.env_count

            def merged(key: str) -> dict[str, list]:
                return {
                    name: [x for r in ranks for x in r[key].get(name, [])] for name in result["mean_return_last100"]
                }

            last, first = merged("returns"), merged("first_returns")
            episodes = {name: sum(r["episodes_by_type"].get(name, 0) for r in ranks) for name in last}
            result["mean_return_last100"] = {k: (round(float(np.mean(v)), 3) if v else None) for k, v in last.items()}
            result["mean_return_first100"] = {k: (round(float(np.mean(v)), 3) if v else None) for k, v in first.items()}
            result["learned"] = {
                k: random_return.verdict(v, first[k], episodes[k], randoms.get(k), starts.get(k))
                for k, v in last.items()
            }
        result["dist"] = section
        return result

    def close(self) -> None:
        if tdist.is_initialized():
            try:
                tdist.destroy_process_group()
            except Exception:
                log.exception("destroying the process group failed")
