"""The live view: the panel fits 80 columns with every type of the seed12 mix, the bar and ETA
follow the stop condition that comes first, trends, the plain line off a terminal, and other
libraries' INFO lines kept off the terminal."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from conftest import SEED12_TYPES
from rlpipe.telemetry.progress import Progress, Status, quiet_console_logs


def status(elapsed=30.0, steps=100_000, sps=2_000.0, returns=None) -> Status:
    return Status(
        stage="day4",
        elapsed_s=elapsed,
        env_steps=steps,
        sps=sps,
        updates=12,
        env_count=240,
        active=200,
        dormant=40,
        memory_mb=1234.0,
        returns=returns or {},
    )


def render(progress: Progress, st: Status) -> str:
    console = Console(width=80, file=io.StringIO(), color_system=None)
    console.print(progress.panel(st))
    return console.file.getvalue()


def test_panel_fits_80_columns_with_every_seed12_type():
    rets = {n: (-1) ** i * 10.0 ** (i % 5) for i, n in enumerate(SEED12_TYPES)}
    rets["faulty"] = None  # no episode finished yet
    text = render(Progress(10, 500_000, 60.0), status(returns=rets))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and len(lines) <= 14
    for name in SEED12_TYPES:
        assert name in text
    assert "-10,000" in text and "0:00:30" in text and "200 active · 40 dormant" in text


def test_fraction_and_eta_follow_the_first_stop_condition():
    p = Progress(10, total_env_steps=200_000, duration_s=60.0)
    st = status(elapsed=30.0, steps=150_000, sps=5_000.0)
    assert p.fraction(st) == 0.75  # steps are ahead of time
    assert p.eta_s(st) == 10.0  # 50k steps at 5k sps < 30 s left
    p = Progress(10, total_env_steps=None, duration_s=60.0)
    assert p.fraction(st) == 0.5 and p.eta_s(st) == 30.0


def test_trend_arrows():
    p = Progress(10)
    assert p.trend("cartpole", 100.0, now=0.0) == "→"
    assert p.trend("cartpole", 150.0, now=10.0) == "↑"
    assert p.trend("cartpole", 100.5, now=20.0) == "→"  # within 1 % of where it was
    assert p.trend("cartpole", 50.0, now=60.0) == "↓"


def test_plain_line_once_per_interval_off_a_terminal(capsys):
    with Progress(3600, 500_000, None) as p:
        assert not p.tty
        p.update(status(returns={"cartpole": 21.5, "acrobot": None}))
        p.update(status(returns={"cartpole": 22.5}))
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    assert "20%" in out[0] and "cartpole=21.5" in out[0] and "acrobot=-" in out[0]


def test_third_party_info_stays_off_the_terminal_but_reaches_the_file(tmp_path):
    root = logging.getLogger()
    term, file = io.StringIO(), tmp_path / "run.log"
    handlers = [logging.StreamHandler(term), logging.FileHandler(file)]
    old_level = root.level
    root.setLevel(logging.INFO)
    for h in handlers:
        root.addHandler(h)
    try:
        quiet_console_logs()
        quiet_console_logs()  # idempotent
        assert len(handlers[0].filters) == 1 and not handlers[1].filters
        logging.getLogger("tensorboard").info("Directory watcher advancing")
        logging.getLogger("tensorboard").warning("a real problem")
        logging.getLogger("rlpipe.driver").info("startup: learner built")
    finally:
        for h in handlers:
            root.removeHandler(h)
            h.close()
        root.setLevel(old_level)
    shown = term.getvalue()
    assert "Directory watcher" not in shown and "a real problem" in shown and "learner built" in shown
    assert "Directory watcher" in file.read_text()
