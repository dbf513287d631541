"""`python -m rlpipe`: compose the Hydra config, validate it, run the engine."""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlpipe.config import ConfigError, RunSpec, conf_dir, register_schema, run_spec
from rlpipe.config_errors import EXIT_CONFIG, check_known_keys, explain
from rlpipe.files import make_private
from rlpipe.ranks import hydra_run_dir
from rlpipe.supervisor import stopping

if TYPE_CHECKING:
    from rlpipe.supervisor.runmode import RunMode

register_schema()
# hydra.run.dir in conf/config.yaml: the same directory for every torchrun rank (rlpipe.ranks)
OmegaConf.register_new_resolver("rlpipe_run_dir", hydra_run_dir, replace=True)
log = logging.getLogger("rlpipe")
# conf/hydra/launcher/submitit_{slurm,local}.yaml share their names with the plugin's schemas on
# purpose (hydra/launcher=submitit_slurm as the plugin documents it, typos caught by the schema);
# Hydra 1.3 still validates them against it and warns that it may stop some day.
warnings.filterwarnings("ignore", message=r"(?s)\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore")
# 2, EXIT_CONFIG: bad input (rlpipe.config_errors)
EXIT_RANK_LOST = 3  # under torchrun: a peer rank (or the agent) went away mid-run
# 4, EXIT_STALL: the driver's loop stalled (rlpipe.supervisor.stall, which exits the process itself)
# 5, EXIT_DISK_FULL: a write of the run failed for space (rlpipe.supervisor.diskfull; the driver returns it)
EXIT_REDIS_UNREACHABLE = 6  # the external redis.url did not answer at start (rlpipe.supervisor.redis_service)


def run_job(cfg: DictConfig) -> int:
    """One job: validate, then drive the engine; a config error is one paragraph, no traceback.
    Under torchrun (WORLD_SIZE and RANK set) the job is this rank's part (rlpipe.ranks)."""
    faulthandler.enable()  # a crash in native code still says where it happened
    from rlpipe.telemetry.progress import quiet_console_logs

    quiet_console_logs()  # other libraries' INFO lines go to the run's log file only
    from rlpipe.supervisor.diskfull import hold_reserve, release_reserve

    mode: RunMode | None = None  # built once the config is valid; closed on every way out
    try:
        check_known_keys(cfg, RunSpec)  # also those added with `+`: nothing would read them
        spec = run_spec(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        if stopping.pending() is not None:  # a stop signal while Python and Hydra started
            return _stopped_before_driver(spec, run_dir, stopping.pending())
        if spec.run.mode == "validate":
            from rlpipe.envs.validate import validate_types

            return validate_types(spec, run_dir)
        import_torch_early()
        mode = _run_mode(spec)
        run_dir = mode.start(run_dir)
        make_private(run_dir)
        hold_reserve(run_dir)
        try:
            from rlpipe.supervisor.driver import Driver  # torch: imported on its thread meanwhile

            driver = Driver(mode.spec, run_dir, OmegaConf.to_yaml(cfg), mode)
            return driver.run()
        finally:
            release_reserve(run_dir)
    except (ConfigError, OmegaConfBaseException) as exc:
        print(f"rlpipe: {getattr(exc, 'what', 'config error')}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:
        from rlpipe.ranks.sync import RankLost
        from rlpipe.supervisor.redis_service import RedisUnreachable

        if not isinstance(exc, (RankLost, RedisUnreachable)):
            raise
        print(f"rlpipe: {exc}", file=sys.stderr, flush=True)
        return EXIT_RANK_LOST if isinstance(exc, RankLost) else EXIT_REDIS_UNREACHABLE
    finally:
        if mode is not None:
            mode.close()


def _stopped_before_driver(spec: RunSpec, run_dir: Path, signum: int) -> int:
    """A stop signal came before the driver existed: nothing was started, the run dir gets its
    short summary and the one line, and the exit code is the signal's."""
    at_s = stopping.pending_at_s()
    stop = stopping.stopped_by("signal", at_s, signum, "start-up", after="config composed")
    run_dir.mkdir(parents=True, exist_ok=True)
    make_private(run_dir)
    path = stopping.write_short_summary(
        run_dir,
        stop,
        stage=spec.stage,
        env_count=spec.env_count,
        env_steps=0,
        wall_s=round(time.time() - stopping.process_started_at(), 3),
        resumed_from_step=0,
    )
    stopping.say_stopped_in_startup(signum, "config composed", at_s, path)
    return 128 + signum


def import_torch_early() -> None:
    """Start importing torch on a thread. The first env step waits for the learner, and the
    learner for torch (about 1.5 s of imports); meanwhile the main thread starts Redis, the
    forkserver and the workers, and its waits on them leave the interpreter to this thread.
    Only once the config is valid, so a config error still exits at once. The driver's own
    `import torch` then waits for this one to finish (Python's per-module import lock)."""
    threading.Thread(target=importlib.import_module, args=("torch",), name="rlpipe-import-torch", daemon=True).start()


def _run_mode(spec: RunSpec) -> RunMode:
    """Solo in a plain process; under torchrun this rank's share of the job (its ConfigError
    before any collective)."""
    from rlpipe.ranks import rank_from_env
    from rlpipe.supervisor.runmode import Solo

    info = rank_from_env()
    if info is None:
        return Solo(spec)
    from rlpipe.ranks.run import Ranks

    return Ranks(info, spec)


HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"  # set: Hydra raises its errors instead of printing them


class _Job:
    failed = False  # an exception came out of run_job: not Hydra's, not for explain()


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    full_error = os.environ.pop(HYDRA_FULL_ERROR, None)  # not inherited by the run's children
    try:
        code = run_job(cfg)
    except BaseException:
        _Job.failed = True
        raise
    finally:
        if full_error is not None:
            os.environ[HYDRA_FULL_ERROR] = full_error
    if code:
        sys.exit(code)


def main() -> None:
    """`python -m rlpipe`: Hydra composes the config and makes the run dir, then `run_job`.
    What Hydra itself refuses (a key no setting has, a value of the wrong type, a group option
    that does not exist, an override it cannot parse, a run dir it cannot create) is a config
    error like rlpipe's own: one paragraph, exit 2 (rlpipe.config_errors), not Hydra's report
    and exit 1."""
    os.environ.setdefault(HYDRA_FULL_ERROR, "1")
    try:
        _hydra_main()
    except Exception as exc:
        text = None if _Job.failed else explain(exc, RunSpec)
        if text is None:
            raise
        print(text, file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
