"""Bad input on the command line, each row of docs/running.md's "Bad input" table that Hydra
finds before rlpipe's own checks (an unknown key, also with `+`; a value of the wrong type; a
group option that does not exist; an override it cannot parse; a run dir it cannot create):
one paragraph naming the key and what is allowed, exit 2, no traceback, nothing started.
(rlpipe's own checks: tests/test_config.py and the tests each table row names.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, compose_cfg, driver_dies_with_pytest, rlpipe_cmd, rlpipe_with
from rlpipe.config import ConfigError, RunSpec
from rlpipe.config_errors import OPEN_KEYS, check_known_keys

ROWS = {
    "typo": (["env_cont=64"], ["Unknown config key env_cont", "Did you mean `env_count`?"]),
    "typo-with-plus": (["+env_cont=64"], ["Unknown config key env_cont", "Did you mean `env_count`?"]),
    "unknown-in-a-section": (["+learner.epoch=3"], ["Unknown config key learner.epoch", "`learner.epochs`"]),
    "not-an-integer": (["env_count=abc"], ["Invalid config value env_count='abc': allowed is an integer"]),
    "not-a-number": (["learner.learning_rate=fast"], ["learner.learning_rate='fast': allowed is a number"]),
    "no-such-option": (["env_mix=cartpol"], ["no option `cartpol` in config group `env_mix`", "`env_mix=cartpole`"]),
    "no-such-stage": (["+stage=day9"], ["no option `day9` in config group `stage`", "day0, day1"]),
    "unparsable": (["env_count=[1"], ["cannot read the override `env_count=[1`"]),
    "run-dir-not-creatable": (["hydra.run.dir=/proc/x"], ["cannot create or write the run directory", "/proc/x"]),
    # rlpipe's own check of an env node's parameters (a `+` there is allowed: the type checks it)
    "env-parameter-unknown": (
        ["+env_mix.types.cartpole.bar=2"],
        ["cannot be built", "unexpected keyword argument 'bar'"],
    ),
}


def test_what_hydra_refuses_is_one_paragraph_and_exit_2(short_tmp):
    """Every row at once (each a real CLI run that stops before anything starts: about 0.6 s
    of CPU each), every row's failures reported together."""
    procs = {
        row: subprocess.Popen(
            rlpipe_cmd(short_tmp / row, *overrides),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=driver_dies_with_pytest,
        )
        for row, (overrides, _said) in ROWS.items()
    }
    failures = {}
    for row, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        paragraph = err.strip()
        wrong = [
            what
            for what, ok in (
                (f"exit {proc.returncode}", proc.returncode == 2),
                ("a traceback or Hydra's report", "Traceback" not in err and "HYDRA_FULL_ERROR" not in err),
                ("not one rlpipe paragraph", paragraph.startswith("rlpipe: ") and "\n" not in paragraph),
                ("a summary.json", not (short_tmp / row / "summary.json").exists()),
                *((f"missing {words!r}", words in paragraph) for words in ROWS[row][1]),
            )
            if not ok
        ]
        if wrong:
            failures[row] = (wrong, paragraph[-2000:])
    assert not failures, failures


SWEEPS = {
    # rlpipe's own check of a value, in the last job: found before the first job trains
    "a-value-in-the-last-job": (
        ["+stage=day1", "learner.epochs=2,3,0"],
        "job #2 of 3 (+stage=day1 learner.epochs=0): Invalid config value learner.epochs=0",
    ),
    # what Hydra refuses while composing one job, said as it says it for a single run
    "a-group-option": (["env_mix=cartpole,cartpol"], "job #1 of 2 (env_mix=cartpol): no option `cartpol`"),
    "a-type": (["env_count=16,abc"], "job #1 of 2 (env_count=abc): Invalid config value env_count='abc'"),
    # the driver's first checks, made for every job: the mix described (an env id that does
    # not exist) and the memory its board and rollouts need on this machine (day4's 7,000
    # envs with MiniGrid's rgb view at rollout 256: about 80 GiB; its first job, 70 envs)
    "an-env-id": (
        ["env_mix=gym", "env_mix.id=CartPole-v1,CartPoleX-v1"],
        "job #1 of 2 (env_mix=gym env_mix.id=CartPoleX-v1): env type 'CartPoleX-v1'",
    ),
    # a Slurm sweep: the keys checked here (a key no setting has is one on every node), the
    # values where each job starts; from a machine without `srun` it is refused with the
    # launcher to try here (submitit's traceback before)
    "slurm-a-key": (
        ["hydra/launcher=submitit_slurm", "+learner.epoch=3,4"],
        "job #0 of 2 (+learner.epoch=3): Unknown config key learner.epoch",
    ),
    "slurm-no-srun": (
        ["hydra/launcher=submitit_slurm", "learner.epochs=2,0"],
        "hydra/launcher=submitit_slurm sends each job to Slurm, and this machine has no `srun` on its PATH",
    ),
    "the-memory-budget": (
        [
            "+stage=day4",
            "buffer=seed",
            "env_mix.types.minigrid.view=rgb",
            "learner.rollout_len=256",
            "env_count=70,7000",
        ],
        "job #1 of 2 (+stage=day4 buffer=seed env_mix.types.minigrid.view=rgb learner.rollout_len=256 env_count=7000): "
        "This config needs",
    ),
}


def refused(*overrides: str, one_line: bool = True) -> str:
    """`python -m rlpipe <overrides>` run to its refusal: what it said, checked (exit 2, no
    traceback, with `one_line` a single line: a checkpoint error lists each file apart)."""
    out = rlpipe_with(*overrides)
    paragraph = out.stderr.strip()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert not one_line or "\n" not in paragraph, paragraph
    return paragraph


@pytest.mark.parametrize("row", SWEEPS)
def test_a_multirun_with_one_bad_job_starts_none(short_tmp, row):
    """`python -m rlpipe -m ...` checks every job's config before the first starts
    (rlpipe/sweep_check.py): one paragraph naming the job, exit 2, no sweep folder."""
    if row.startswith("slurm") and shutil.which("srun"):
        pytest.skip("a Slurm cluster: this sweep would be submitted")
    overrides, said = SWEEPS[row]
    sweep_dir = short_tmp / "sweep"
    paragraph = refused("-m", *overrides, f"hydra.sweep.dir={sweep_dir}")
    assert paragraph.startswith(f"rlpipe: config error: {said}"), paragraph
    assert paragraph.endswith("No job of the sweep was started.")
    assert not sweep_dir.exists()


def test_a_day0_sweep_leaves_each_type_to_its_validation(short_tmp):
    """day0 (`run.mode=validate`) builds every type and reports the ones that fail as its
    job's outcome (exit 1, env_validation.md): the sweep check does not describe its mix, so
    the job runs and says which type failed and why."""
    sweep_dir = short_tmp / "sweep"
    out = rlpipe_with("-m", "+stage=day0", "env_mix=gym", "env_mix.id=CartPoleX-v1", f"hydra.sweep.dir={sweep_dir}")
    assert out.returncode == 1 and "No job of the sweep was started" not in out.stderr, out.stderr[-3000:]
    assert "CartPoleX-v1 | **NO**" in (sweep_dir / "0" / "env_validation.md").read_text()


def test_plus_adds_keys_only_where_keys_are_names():
    """`+` under env_mix.types / env_mix.weights / buffer.keys adds an entry (the mix and the
    board check it); anywhere else a key the schema lacks is refused before the run."""
    assert OPEN_KEYS == ("env_mix.types", "env_mix.weights", "buffer.keys")
    check_known_keys(compose_cfg(["+env@env_mix.types.acrobot=acrobot", "+env_mix.weights.acrobot=1"]), RunSpec)
    for override, key in (("+run.duraton_s=5", "run.duraton_s"), ("+heartbeat.x=1", "heartbeat.x")):
        with pytest.raises(ConfigError, match=f"Unknown config key {key}"):
            check_known_keys(compose_cfg([override]), RunSpec)


def test_help_describes_rlpipe_its_main_options_and_stages():
    """`--help` is Hydra's hydra.help template filled by conf/hydra/help/rlpipe.yaml, not
    Hydra's generic page."""
    out = rlpipe_with("--help", timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("rlpipe trains one policy") and "powered by Hydra" not in out.stdout
    for words in ("env_count=N", "run.duration_s=", "run.resume=", "+stage=dayN", "day4", "exit 130 or 143"):
        assert words in out.stdout, words
    assert "env_mix: acrobot," in out.stdout and "stage: day0, day1" in out.stdout  # the groups, from conf/
    # every exit code the CLI has is in the help's list (6, the external Redis, was missing)
    from rlpipe.app import EXIT_RANK_LOST, EXIT_REDIS_UNREACHABLE
    from rlpipe.config_errors import EXIT_CONFIG
    from rlpipe.supervisor.diskfull import EXIT_DISK_FULL
    from rlpipe.supervisor.stall import EXIT_STALL

    listed = " ".join(out.stdout.split("Exit codes:")[1].split("After a run")[0].split())
    for code in (EXIT_CONFIG, EXIT_RANK_LOST, EXIT_STALL, EXIT_DISK_FULL, EXIT_REDIS_UNREACHABLE):
        assert re.search(rf"(:|,) {code} [a-z]", listed), (code, listed)


def files_in(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def earlier_run_in(folder: Path) -> None:
    """What a training run leaves that a fresh one would write over (the guard reads names)."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt_000000030016.pt").write_bytes(b"weights")
    (folder / "tb").mkdir()
    (folder / "tb" / "events.out.tfevents.1.host.1.0").write_bytes(b"events")
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("the earlier run's config\n")


def test_a_fresh_run_in_a_folder_holding_an_earlier_run_writes_nothing(short_tmp):
    """run.resume=false (the default) in a fixed hydra.run.dir that holds a run: refused before
    Hydra writes its .hydra/ (rlpipe/run_dir_guard.py); run.resume=true goes past the guard
    (and here finds the checkpoint is not one); a multirun's sweep dir likewise."""
    run_dir = short_tmp / "run"
    earlier_run_in(run_dir)
    before = files_in(run_dir)
    paragraph = refused(f"hydra.run.dir={run_dir}")
    assert paragraph.startswith(f"rlpipe: config error: hydra.run.dir={run_dir} already holds a run (")
    assert "checkpoints/ (1 checkpoint), tb/ (1 TensorBoard event file)" in paragraph and "run.resume=true" in paragraph
    assert files_in(run_dir) == before

    paragraph = refused(f"hydra.run.dir={run_dir}", "run.resume=true", one_line=False)
    assert "already holds" not in paragraph
    assert "not a checkpoint file" in paragraph  # past the guard: the resume read what is there

    sweep_dir = short_tmp / "sweep"
    earlier_run_in(sweep_dir / "1")
    before = files_in(sweep_dir)
    paragraph = refused("-m", "run.seed=1,2", f"hydra.sweep.dir={sweep_dir}")
    assert paragraph.startswith(f"rlpipe: config error: hydra.sweep.dir={sweep_dir} already holds the runs of")
    assert "1/checkpoints/ (1 checkpoint)" in paragraph
    assert files_in(sweep_dir) == before
