"""TensorBoard writer for a run: namespaced tags (charts/, losses/, envs/, board/) and the
run's config as text, after CleanRL. (The tag prefix board/ is the shared-memory obs board's
figures; the writer itself is `TbWriter`, so "board" names only that board.)"""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summary


class TbWriter:
    def __init__(self, run_dir: Path, config_yaml: str | None):
        self.writer = SummaryWriter(str(run_dir / "tb"))
        if config_yaml is not None:
            self.writer.add_text("config", "```yaml\n" + config_yaml + "\n```")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def histogram(self, tag: str, values, step: int) -> None:
        self.writer.add_histogram(tag, values, step)

    def hparams(self, hparams: dict, metrics: dict) -> None:
        """Hyperparameters and final metrics in this run's own event file (add_hparams would
        open a sub-run), so TensorBoard's hparams tab lines up the jobs of a multirun."""
        exp, ssi, sei = hparams_summary(hparams, metrics)
        fw = self.writer._get_file_writer()
        for summary in (exp, ssi, sei):
            fw.add_summary(summary)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
