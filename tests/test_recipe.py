"""The "Bringing your own env type" recipe of docs/recipes.md (the README points there),
followed as written: its class and its YAML file go into a fresh directory under the names
their first lines give, and its command trains on them from that directory through the CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

from conftest import REPO

SECTION = "## Bringing your own env type"


def recipe_blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced block of the recipe section, in order."""
    text = (REPO / "docs" / "recipes.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end > 0 else None]
    return re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)


def test_readme_recipe_adds_an_env_type_with_one_yaml_and_one_class(short_tmp):
    blocks = recipe_blocks()
    files = [(lang, body) for lang, body in blocks if lang in ("python", "yaml")]
    commands = [body.strip() for lang, body in blocks if lang == "bash"]
    assert [lang for lang, _ in files] == ["python", "yaml"] and len(commands) == 1
    for _lang, body in files:
        name = body.splitlines()[0].lstrip("# ").strip()  # "# corridor.py" -> its path
        path = short_tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)

    argv = shlex.split(os.path.expandvars(commands[0].replace("$PWD", str(short_tmp))))
    assert argv[:3] == ["python", "-m", "rlpipe"]
    run_dir = short_tmp / "run"
    # This checkout's rlpipe (an installed one would do as well); nothing of the recipe's own.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, *argv[1:], f"hydra.run.dir={run_dir}"],
        cwd=short_tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_types"] == {"corridor": 16}
    assert summary["env_steps"] >= 20_000 and summary["episodes"] > 100
    assert summary["mean_return_last100"]["corridor"] is not None
