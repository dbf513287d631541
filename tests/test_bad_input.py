"""Bad input on the command line, each row of docs/running.md's "Bad input" table that Hydra
finds before rlpipe's own checks (an unknown key, also with `+`; a value of the wrong type; a
group option that does not exist; an override it cannot parse; a run dir it cannot create):
one paragraph naming the key and what is allowed, exit 2, no traceback, nothing started.
(rlpipe's own checks: tests/test_config.py and the tests each table row names.)"""

from __future__ import annotations

import pytest

from conftest import compose_cfg, run_cli
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
    "run-dir-not-creatable": (["hydra.run.dir=/proc/x"], ["cannot create the run directory", "/proc/x"]),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_what_hydra_refuses_is_one_paragraph_and_exit_2(short_tmp, row):
    overrides, said = ROWS[row]
    out = run_cli(short_tmp / "run", *overrides, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "HYDRA_FULL_ERROR" not in out.stderr
    paragraph = out.stderr.strip()
    assert paragraph.startswith("rlpipe: ") and "\n" not in paragraph, paragraph
    for words in said:
        assert words in paragraph
    assert not (short_tmp / "run" / "summary.json").exists()


def test_plus_adds_keys_only_where_keys_are_names():
    """`+` under env_mix.types / env_mix.weights / buffer.keys adds an entry (the mix and the
    board check it); anywhere else a key the schema lacks is refused before the run."""
    assert OPEN_KEYS == ("env_mix.types", "env_mix.weights", "buffer.keys")
    check_known_keys(compose_cfg(["+env@env_mix.types.acrobot=acrobot", "+env_mix.weights.acrobot=1"]), RunSpec)
    for override, key in (("+run.duraton_s=5", "run.duraton_s"), ("+heartbeat.x=1", "heartbeat.x")):
        with pytest.raises(ConfigError, match=f"Unknown config key {key}"):
            check_known_keys(compose_cfg([override]), RunSpec)
