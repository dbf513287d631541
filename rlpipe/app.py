"""`python -m rlpipe`: compose the Hydra config, validate it, run the engine."""
from __future__ import annotations

import faulthandler
import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlpipe.config import ConfigError, conf_dir, register_schema, to_plain

register_schema()
log = logging.getLogger("rlpipe")
EXIT_CONFIG = 2


def run_job(cfg: DictConfig) -> int:
    """One job: validate, then drive the engine; a config error is one paragraph, no traceback."""
    faulthandler.enable()           # a crash in native code still says where it happened
    from rlpipe.telemetry.progress import quiet_console_logs
    quiet_console_logs()            # other libraries' INFO lines go to the run's log file only
    from rlpipe.supervisor.driver import Driver   # torch is imported only past validation

    try:
        spec = to_plain(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        if spec.mode == "validate":
            from rlpipe.envs.validate import validate_types
            return validate_types(spec, run_dir)
        driver = Driver(spec, run_dir, OmegaConf.to_yaml(cfg))
        return driver.run()
    except (ConfigError, OmegaConfBaseException) as exc:
        print(f"rlpipe: {getattr(exc, 'what', 'config error')}: {exc}", file=sys.stderr)
        return EXIT_CONFIG


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def main(cfg: DictConfig) -> None:
    code = run_job(cfg)
    if code:
        sys.exit(code)
