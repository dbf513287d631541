"""TensorBoard writer for a run: namespaced tags (charts/, losses/, envs/, board/) and the
run's config as text, after CleanRL."""
from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class RunBoard:
    def __init__(self, run_dir: Path, config_yaml: str):
        self.writer = SummaryWriter(str(run_dir / "tb"))
        self.writer.add_text("config", "```yaml\n" + config_yaml + "\n```")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
