"""argparse types for the benchmarks' flags: a value out of range is argparse's one-line usage
error (exit 2) before anything runs, not a traceback or an rlpipe run refused half-way.
(A benchmark's folder is on sys.path when it runs as a script.)"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def git_revision(text: str) -> str:
    """A revision of this repository that names a commit (a hash, a branch, a tag, HEAD~2)."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if found.returncode != 0:
        raise argparse.ArgumentTypeError(f"{text!r} names no commit of {REPO} (git rev-parse)")
    return text
