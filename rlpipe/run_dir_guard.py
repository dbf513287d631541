"""A fresh run never writes over an earlier run's files.

With a fixed `hydra.run.dir` (a service's, a script's) and `run.resume=false` (the default),
a second start in that folder used to train from scratch on top of the first: its checkpoints
replaced where their step numbers met, its TensorBoard events mixed into the same `tb/`, its
lifecycle rows into the same database, its `summary.json` and Hydra's `.hydra/config.yaml`
overwritten. This Hydra callback (conf/config.yaml, `hydra.callbacks`) looks before Hydra
writes anything (its `on_run_start` comes before the run dir is made): a folder that holds
an earlier run's training files refuses a fresh run, one paragraph, exit 2, nothing written.
`run.resume=true` or `auto` continue that run instead, as they always did. A multirun whose
`hydra.sweep.dir` holds an earlier sweep's runs is refused the same way.

Not under torchrun: its ranks share one folder and a restarted job resumes by itself
(rlpipe.ranks); the driver's own checks apply there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rlpipe.config_errors import exit_with
from rlpipe.ranks import rank_from_env

# what a training run writes that a fresh one would overwrite or mix into, and how to say it
# (a run refused by a config check holds only Hydra's .hydra/ and its log; a validation run
# writes no checkpoint, tb/ or lifecycle database)
TRAINING_FILES = (
    ("checkpoints/*.pt", "checkpoints/ ({n} checkpoint{s})"),
    ("tb/events.out.tfevents.*", "tb/ ({n} TensorBoard event file{s})"),
    ("lifecycle.sqlite", "lifecycle.sqlite"),
)


def earlier_run(run_dir: Path) -> list[str]:
    """What an earlier run left in `run_dir`, in a few words each ([] where nothing)."""
    if not run_dir.is_dir():
        return []
    held = []
    for pattern, words in TRAINING_FILES:
        n = len(list(run_dir.glob(pattern)))
        if n:
            held.append(words.format(n=n, s="s" if n > 1 else ""))
    return held


def held_text(held: list[str]) -> str:
    """The first three of `held` and how many more."""
    more = f" and {len(held) - 3} more" if len(held) > 3 else ""
    return ", ".join(held[:3]) + more


class KeepEarlierRuns(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if rank_from_env() is not None or config.run.resume is not False:
            return
        run_dir = Path(config.hydra.run.dir)
        held = earlier_run(run_dir)
        if held:
            exit_with(
                f"hydra.run.dir={run_dir} already holds a run ({held_text(held)}), and with "
                "run.resume=false a fresh run would write over it. Continue that run with "
                "run.resume=true (or auto), or give another hydra.run.dir; nothing was written."
            )

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.run.resume is not False:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        held = earlier_run(sweep_dir) + [
            f"{job.name}/{what}" for job in sorted(sweep_dir.glob("*/")) for what in earlier_run(job)
        ]
        if held:
            exit_with(
                f"hydra.sweep.dir={sweep_dir} already holds the runs of an earlier sweep "
                f"({held_text(held)}), and with run.resume=false its jobs would write over them. "
                "Continue them with run.resume=true (or auto), or give another hydra.sweep.dir; "
                "nothing was written."
            )
