"""`python -m rlpipe`: compose the Hydra config, validate it, run the engine."""
from __future__ import annotations

import faulthandler
import logging
import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlpipe.config import ConfigError, conf_dir, register_schema, run_spec
from rlpipe.dist import hydra_run_dir

register_schema()
# hydra.run.dir in conf/config.yaml: the same directory for every torchrun rank (rlpipe.dist)
OmegaConf.register_new_resolver("rlpipe_run_dir", hydra_run_dir, replace=True)
log = logging.getLogger("rlpipe")
# conf/hydra/launcher/submitit_{slurm,local}.yaml share their names with the plugin's schemas on
# purpose (hydra/launcher=submitit_slurm as the plugin documents it, typos caught by the schema);
# Hydra 1.3 still validates them against it and warns that it may stop some day.
warnings.filterwarnings("ignore", message=r"(?s)\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore")
EXIT_CONFIG = 2
EXIT_RANK_LOST = 3          # under torchrun: a peer rank (or the agent) went away mid-run
# 4, EXIT_STALL: the driver's loop stalled (rlpipe.supervisor.stall, which exits the process itself)


def run_job(cfg: DictConfig) -> int:
    """One job: validate, then drive the engine; a config error is one paragraph, no traceback.
    Under torchrun (WORLD_SIZE and RANK set) the job is this rank's part (rlpipe.dist)."""
    faulthandler.enable()           # a crash in native code still says where it happened
    from rlpipe.telemetry.progress import quiet_console_logs
    quiet_console_logs()            # other libraries' INFO lines go to the run's log file only
    from rlpipe.supervisor.driver import Driver  # torch is imported only past validation

    ranks = None
    try:
        spec = run_spec(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        if spec.run.mode == "validate":
            from rlpipe.envs.validate import validate_types
            return validate_types(spec, run_dir)
        from rlpipe.dist import rank_from_env
        info = rank_from_env()
        if info is not None:
            from rlpipe.dist.run import DistRun
            ranks = DistRun(info, spec)       # the rank's share of the job (ConfigError first)
            ranks.start()
            run_dir = ranks.agree_run_dir(run_dir)
            spec = ranks.spec
        driver = Driver(spec, run_dir, OmegaConf.to_yaml(cfg), dist=ranks)
        return driver.run()
    except (ConfigError, OmegaConfBaseException) as exc:
        print(f"rlpipe: {getattr(exc, 'what', 'config error')}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:
        from rlpipe.dist.sync import RankLost
        if not isinstance(exc, RankLost):
            raise
        print(f"rlpipe: {exc}", file=sys.stderr, flush=True)
        return EXIT_RANK_LOST
    finally:
        if ranks is not None:
            ranks.close()


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def main(cfg: DictConfig) -> None:
    code = run_job(cfg)
    if code:
        sys.exit(code)
