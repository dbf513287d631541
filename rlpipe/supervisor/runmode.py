"""How this process takes part in the job: alone (`Solo`, here) or as one rank of a torchrun
job (`Ranks`, rlpipe/ranks/run.py). The app builds one, the driver and its run metrics hold
it and ask it; nothing in the supervisor asks which one it is.

What differs between the two, and so what the interface covers:

- the run: this process's share of the job (`spec`), its run directory (`start`), its run id
  and the fields it announces in Redis;
- the learner: which one trains (`make_learner`), how it starts after a resume
  (`start_learner`), when the run stops (`should_stop`) and checkpoints (`checkpoint_*`): alone
  on the run's own clock and counters, as ranks after the update round that says so;
- outputs: whether this process writes the job's (`writes_job_outputs`: TensorBoard, the
  hparams run, the export, evaluation during training, the random-return probe), and the
  end of the run (`summary_section`, `finish_summary`, the last line's `line_prefix`);
- the way out: an update in flight at teardown, what a dead peer left behind, the process
  group (`close`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan
from rlpipe.shm.segment import new_run_id


class RunMode(ABC):
    spec: RunSpec  # this process's part of the job (its env count, update_envs, env ids)
    writes_job_outputs: bool  # TensorBoard, hparams, export, evaluation, random-return probe
    line_prefix: str  # before the last line's "done" / "stopped by": "" or "rank 1/2 "

    @abstractmethod
    def start(self, output_dir: Path) -> Path:
        """Join the job (collectives from here on) and return this process's run directory
        (Hydra's `output_dir` alone; under torchrun agreed with rank 0)."""

    @abstractmethod
    def new_run_id(self) -> str:
        """The run id naming segments, Redis keys and socket dirs (rlpipe.shm.segment.new_run_id)."""

    @abstractmethod
    def redis_fields(self) -> dict:
        """Fields of the run's Redis hash beyond the driver's own (state, pid, env_count, run_dir)."""

    @abstractmethod
    def make_learner(self, spec: RunSpec, plan: MixPlan):
        """The learner of this process (a learner.central.CentralLearner)."""

    @abstractmethod
    def start_learner(self, learner, resumed: bool) -> None:
        """After the learner's checkpoint (if any) is loaded, before it trains."""

    @abstractmethod
    def make_tb(self, run_dir: Path, config_yaml: str | None):
        """The run's TensorBoard writer (rlpipe.telemetry.tb.TbWriter's methods)."""

    @abstractmethod
    def should_stop(self, learner, elapsed_s: float) -> bool:
        """Whether the loop ends now, `elapsed_s` after the run's clock started."""

    @abstractmethod
    def checkpoint_after_update(self, learner) -> bool:
        """Asked right after each finished update: take a checkpoint now."""

    @abstractmethod
    def checkpoint_on_clock(self, learner, timer, now: float) -> bool:
        """Asked once a second with the checkpoint timer (cadence.Every): take one now."""

    @abstractmethod
    def join_update_in_flight(self, learner) -> None:
        """Teardown: the update in flight when the loop ended (raises when it cannot finish)."""

    @abstractmethod
    def sweep_after_teardown(self) -> None:
        """After the run's own resources are gone: what else must not be left behind."""

    @abstractmethod
    def say_stopping(self, signum: int) -> None:
        """A signal stopped the run: said before the teardown starts."""

    @abstractmethod
    def summary_section(self) -> dict:
        """`summary.json` `dist` as the run metrics build the summary."""

    @abstractmethod
    def finish_summary(self, result: dict, stop_signal: int | None, run_dir: Path) -> dict:
        """The summary after teardown (`stop_signal`: the signal that stopped the run, if one did)."""

    @abstractmethod
    def close(self) -> None:
        """The app's last word, on every way out (also when `start` failed)."""


class Solo(RunMode):
    """A plain single process: the job is this process's, and so are its outputs."""

    writes_job_outputs = True
    line_prefix = ""

    def __init__(self, spec: RunSpec):
        self.spec = spec

    def start(self, output_dir: Path) -> Path:
        return output_dir

    def new_run_id(self) -> str:
        return new_run_id()

    def redis_fields(self) -> dict:
        return {}

    def make_learner(self, spec: RunSpec, plan: MixPlan):
        from rlpipe.learner.central import CentralLearner  # torch: only once the driver builds it

        return CentralLearner(spec, plan)

    def start_learner(self, learner, resumed: bool) -> None:
        pass  # the checkpoint it loaded is the start

    def make_tb(self, run_dir: Path, config_yaml: str | None):
        from rlpipe.telemetry.tb import TbWriter  # lazily: workers start without its imports

        return TbWriter(run_dir, config_yaml)

    def should_stop(self, learner, elapsed_s: float) -> bool:
        run = self.spec.run
        if run.total_env_steps and learner.counters.env_steps >= run.total_env_steps:
            return True
        return bool(run.duration_s and elapsed_s >= run.duration_s)

    def checkpoint_after_update(self, learner) -> bool:
        return False  # the clock alone decides

    def checkpoint_on_clock(self, learner, timer, now: float) -> bool:
        return bool(not learner.random and learner.counters.updates and timer.due(now))

    def join_update_in_flight(self, learner) -> None:
        pass  # the final checkpoint's poll_update(wait=True) waits for it

    def sweep_after_teardown(self) -> None:
        pass  # the run's own segments are gone; others' wait for the next start's sweep

    def say_stopping(self, signum: int) -> None:
        pass  # the last line says it

    def summary_section(self) -> dict:
        return {"world_size": 1, "params_in_sync": None}  # one process: nothing to compare

    def finish_summary(self, result: dict, stop_signal: int | None, run_dir: Path) -> dict:
        return result

    def close(self) -> None:
        pass
