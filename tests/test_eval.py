"""`python -m rlpipe.eval`: a short real run, then the CLI on it (returns, video, TensorBoard);
the errors a user meets (no checkpoint, no config, an unknown type); the board layout of obs."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, wait_for


def eval_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlpipe.eval", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def trained_run(cartpole_multirun):
    """Job 0 of the shared short CartPole multirun: 15k env steps, checkpoints, no good policy."""
    return cartpole_multirun / "0"


def test_eval_writes_returns_video_and_tensorboard(trained_run):
    res = eval_cli(trained_run, "--episodes", "3", "--video")
    assert res.returncode == 0, res.stderr[-3000:]
    out = trained_run / "eval"
    result = json.loads((out / "returns.json").read_text())
    cart = result["types"]["cartpole"]
    assert result["weights"].startswith("checkpoints/ckpt_")
    assert result["env_steps"] >= 15000
    for mode in ("deterministic", "stochastic"):
        s = cart[mode]
        assert s["episodes"] + s["cut"] == 3 and s["episodes"] == 3
        assert 8 <= s["min"] <= s["mean"] <= s["max"] <= 500  # CartPole returns: 1 per step
    assert cart["random"]["source"] == "run" and cart["random"]["mean"] > 0
    md = (out / "returns.md").read_text()
    assert "| cartpole |" in md and "cartpole.mp4" in md
    # the log's line per type, rounded as the table (a pipe is no terminal)
    d, st, r = (f"{cart[m]['mean']:,.1f}" for m in ("deterministic", "stochastic", "random"))
    assert f"rlpipe.eval: cartpole: deterministic {d}, stochastic {st}, random {r}\n" in res.stdout + res.stderr

    import imageio.v2 as imageio

    reader = imageio.get_reader(out / "cartpole.mp4")
    frames = sum(1 for _ in reader)
    assert reader.get_meta_data()["codec"] == "h264"
    assert frames == cart["video_frames"] >= 9  # the reset frame plus one per step

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(trained_run / "tb"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    assert "eval/return_deterministic/cartpole" in acc.Tags()["scalars"]
    gif = acc.Images("eval/video/cartpole")[0].encoded_image_string
    assert gif[:6] in (b"GIF87a", b"GIF89a")


def eval_main(capsys, *args) -> tuple[int, str]:
    """The CLI's main in this process (the subprocess above already covers the entry point)."""
    from rlpipe.eval.__main__ import main

    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_eval_without_checkpoint_is_one_clear_error(trained_run, short_tmp, capsys):
    shutil.copytree(trained_run / ".hydra", short_tmp / ".hydra")
    code, err = eval_main(capsys, short_tmp)
    assert code == 2
    assert "has no checkpoint to evaluate" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (short_tmp / "eval").exists()

    code, err = eval_main(capsys, short_tmp / "nope")
    assert code == 2 and "does not exist" in err

    (short_tmp / ".hydra" / "config.yaml").unlink()
    code, err = eval_main(capsys, short_tmp)
    assert code == 2 and ".hydra/config.yaml" in err and "Traceback" not in err


def test_eval_unknown_type_names_the_run_types(trained_run, capsys):
    code, err = eval_main(capsys, trained_run, "--types", "cartpole,pong")
    assert code == 2
    assert "--types" in err and "pong" in err and "cartpole" in err


@pytest.mark.parametrize(
    "flag, value, allowed",
    [
        ("--episodes", "0", "a positive number of episodes"),
        ("--max-steps", "0", "a positive number of steps"),
        ("--seed", "-1", "an integer from 0 to 4294967295"),  # Gymnasium refuses a negative seed
    ],
)
def test_a_bad_option_is_one_line_naming_it(short_tmp, capsys, flag, value, allowed):
    """Refused before the run dir is read (so before anything is written there)."""
    code, err = eval_main(capsys, short_tmp, flag, value)
    assert code == 2 and err.strip() == f"rlpipe.eval: {flag} {value}: allowed is {allowed}"
    assert list(short_tmp.iterdir()) == []


def test_board_layout_matches_the_worker_rows():
    """An env's obs lands in the first prod(shape) entries of its key's row, as EnvTable
    writes it; the rest of that row and keys the type lacks stay zero."""
    from rlpipe.config import ObsKey
    from rlpipe.envs.contract import EnvSpec
    from rlpipe.envs.registry import ActionSpace, MixPlan
    from rlpipe.learner.play import BoardLayout, env_action

    keys = (ObsKey("rgb", (8, 8, 3), "uint8"), ObsKey("state", (32,), "float32"), ObsKey("vector", (16,), "float32"))
    plan = MixPlan(
        ("images", "cartpole"),
        (
            EnvSpec({"rgb": ((8, 8, 3), "uint8"), "vector": ((3,), "float32")}, "continuous", 2),
            EnvSpec({"state": ((4,), "float32")}, "discrete", 2),
        ),
        np.array([0, 1], dtype=np.int16),
        ActionSpace(2, 2),
        keys,
    )
    t = 1
    layout = BoardLayout(plan, t)
    obs = {"state": np.arange(1, 5, dtype=np.float32)}
    batch, types = layout.batch([obs, obs])
    state = batch["state"].numpy()
    assert state.shape == (2, 32)
    assert (state[:, :4] == obs["state"]).all() and not state[:, 4:].any()
    assert all(not v.numpy().any() for k, v in batch.items() if k != "state")
    assert types.tolist() == [t, t]
    assert env_action("discrete", 2, np.int64(1), np.zeros(3, np.float32)) == 1
    cont = env_action("continuous", 1, np.int64(0), np.array([0.5, 9.0], np.float32))
    assert cont.dtype == np.float32 and cont.tolist() == [0.5]


@pytest.mark.parametrize(
    "sig, after_s", [(signal.SIGINT, 0.0), (signal.SIGTERM, 1.0)], ids=["SIGINT-at-once", "SIGTERM-after-1s"]
)
def test_a_stopped_evaluation_says_so_in_one_line_and_writes_nothing(trained_run, short_tmp, sig, after_s):
    """A stop signal as soon as the command handles it (loading the run: Hydra's composition,
    torch's import) or a second later (loading or playing): one line, the signal's exit code,
    no traceback, and the run's eval/ as an earlier evaluation left it (here: none; a copy of
    the run, the shared run untouched). Before, SIGINT was a KeyboardInterrupt traceback, and
    a KeyboardInterrupt that cut torch's import short (a CI run) aborted at teardown."""
    from test_stopping import catches_sigterm

    run = short_tmp / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("eval"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpipe.eval", str(run), "--episodes", "100000", "--video"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: catches_sigterm(proc.pid), 60, every_s=0.01)
        time.sleep(after_s)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err[-3000:]
    assert err.strip() == (
        f"rlpipe.eval: stopped by {sig.name} before it finished: the run's eval/ keeps what an earlier evaluation wrote"
    )
    assert not (run / "eval").exists() or list((run / "eval").iterdir()) == []


def test_a_film_takes_its_name_only_once_whole(short_tmp):
    """The MP4 is written as <name>.partial-<pid>.mp4 (what a stop signal removes:
    rlpipe.interrupts) and renamed by close(); discard() (a film that failed) removes it and
    leaves an earlier film as it was."""
    from rlpipe.eval.video import Recorder
    from rlpipe.files import own_partial_files

    frame = np.zeros((64, 64, 3), np.uint8)
    earlier = short_tmp / "cartpole.mp4"
    earlier.write_bytes(b"an earlier evaluation's film")
    stopped = Recorder(lambda _env, _obs: frame, earlier)
    for _ in range(5):
        stopped.observe(None, {})
    assert stopped.partial.exists() and earlier.read_bytes() == b"an earlier evaluation's film"
    assert own_partial_files(short_tmp) == [stopped.partial]
    stopped.discard()
    assert not stopped.partial.exists() and earlier.read_bytes() == b"an earlier evaluation's film"

    whole = Recorder(lambda _env, _obs: frame, earlier)
    for _ in range(5):
        whole.observe(None, {})
    assert whole.close() == earlier and not whole.partial.exists()
    assert earlier.read_bytes()[4:8] == b"ftyp"  # an MP4 now


def test_a_run_saved_before_a_setting_existed_is_evaluated_with_its_default(trained_run, short_tmp):
    """A run's .hydra/config.yaml from an older rlpipe lacks the settings added since: they
    take conf/'s defaults (rlpipe.config_compat). In a fresh `python -m rlpipe.eval` nothing
    had registered the schema conf/ names, and every such run failed with Hydra's "Could not
    load 'rlpipe_schema'" traceback (found when redis.start_wait_s was added)."""
    from omegaconf import OmegaConf

    run = short_tmp / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("eval"))
    saved = OmegaConf.load(run / ".hydra" / "config.yaml")
    del saved.redis["start_wait_s"]
    del saved["eval"]
    OmegaConf.save(saved, run / ".hydra" / "config.yaml")
    out = eval_cli(run, "--episodes", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((run / "eval" / "returns.json").read_text())["types"]["cartpole"]["deterministic"]["mean"] > 0


def test_a_type_with_no_episode_is_said_so_in_its_line():
    from rlpipe.eval.results import type_line

    entry = {"deterministic": {"mean": None, "cut": 1}, "stochastic": {"mean": -0.5000000000000002}, "random": {}}
    assert type_line("faulty", entry) == "faulty: deterministic no episode, stochastic -0.5, random no episode"
