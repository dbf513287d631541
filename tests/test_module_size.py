"""Small modules with one job: no module of the package over MAX_LINES lines.

A module that outgrows it is split by what it does (docs/architecture.md names each part).
OVER holds the modules that are past it today, each at the size it may not grow beyond; an
entry goes once its module is split (the test says so when one fits again).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rlpipe"
MAX_LINES = 450
SOURCES = ("py", "pyx", "pxd", "h")  # Python, Cython and the C headers of rlpipe/native

OVER: dict[str, int] = {}


def module_lines() -> dict[str, int]:
    return {
        str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
        for p in sorted(p for ext in SOURCES for p in PACKAGE.rglob(f"*.{ext}"))
    }


def test_no_module_outgrows_the_limit():
    sizes = module_lines()
    too_long = {name: n for name, n in sizes.items() if n > OVER.get(name, MAX_LINES)}
    assert not too_long, f"split these by what they do (at most {MAX_LINES} lines): {too_long}"


def test_the_modules_past_the_limit_are_the_listed_ones():
    sizes = module_lines()
    assert set(OVER) <= set(sizes), f"gone or renamed: {set(OVER) - set(sizes)}"
    fits = {name: sizes[name] for name in OVER if sizes[name] <= MAX_LINES}
    assert not fits, f"these fit in {MAX_LINES} lines now: take them out of OVER: {fits}"
