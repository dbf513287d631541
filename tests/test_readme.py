"""The README as a user reads it: a page (at most 300 lines), its Quick start opening with the
two commands CI also runs, a config-group table that lists exactly the groups and options of
rlpipe/conf/ (and marks the defaults config.yaml picks), and links from it and docs/ that
resolve inside the repository."""

from __future__ import annotations

import re

import yaml

from conftest import REPO

README = REPO / "README.md"
CONF = REPO / "rlpipe" / "conf"
MAX_LINES = 300


def section(text: str, heading: str) -> str:
    """The body of a `## ` section, up to the next `## ` heading."""
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = text.find("\n## ", start)
    return text[start : end if end > 0 else None]


def cells(row: str) -> list[str]:
    """A markdown table row's cells; `\\|` inside a cell is a literal pipe, not a border."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def readme_groups() -> dict[str, tuple[list[str], list[str]]]:
    """group -> (options, options marked `(default)`), from the Config groups table."""
    body = section(README.read_text(), "## Config groups")
    table = {}
    for row in body.splitlines():
        if not row.startswith("| `"):
            continue
        group, options = cells(row)[:2]
        table[group.strip("`")] = (re.findall(r"`([^`]+)`", options), re.findall(r"`([^`]+)` \(default\)", options))
    return table


def conf_groups() -> dict[str, list[str]]:
    """group (its directory under rlpipe/conf, e.g. `hydra/launcher`) -> its options."""
    groups = {}
    for d in sorted(p for p in CONF.rglob("*") if p.is_dir()):
        options = sorted(f.stem for f in d.glob("*.yaml"))
        if options:
            groups[d.relative_to(CONF).as_posix()] = options
    return groups


def conf_defaults() -> dict[str, str]:
    """group -> the option conf/config.yaml's defaults list picks."""
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    return {group: str(option) for entry in defaults if isinstance(entry, dict) for group, option in entry.items()}


def test_readme_is_a_page():
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; the depth belongs in docs/"


def test_quick_start_opens_with_the_run_and_the_test_command():
    body = section(README.read_text(), "## Quick start")
    first_block = re.search(r"```\w*\n(.*?)```", body, flags=re.S).group(1)
    commands = [line.strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    # CI runs the README's test command as it stands there.
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert commands[1] in ci


def test_config_table_lists_every_group_and_option_of_conf():
    table, conf = readme_groups(), conf_groups()
    assert sorted(table) == sorted(conf), (
        f"groups in conf/ missing from the README: {sorted(set(conf) - set(table))}; "
        f"in the README but not in conf/: {sorted(set(table) - set(conf))}"
    )
    for group, options in conf.items():
        listed = table[group][0]
        assert sorted(listed) == options and len(listed) == len(set(listed)), (
            f"{group}: conf/ has {options}, the README lists {sorted(listed)}"
        )


def test_config_table_marks_the_defaults_config_yaml_picks():
    table, defaults = readme_groups(), conf_defaults()
    for group, (_options, marked) in table.items():
        expected = [defaults[group]] if group in defaults else []
        assert marked == expected, f"{group}: config.yaml picks {expected}, the README marks {marked}"


def test_links_of_the_readme_and_docs_resolve_inside_the_repository():
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text()
        # a shared/ folder beside a checkout is no part of a clone of the repository
        assert not re.search(r"(^|[\s(`'\"/.])shared/", text), f"{page.name} points into shared/"
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path = (page.parent / target).resolve()
            assert path.is_relative_to(REPO), f"{page.name} links outside the repository: {target}"
            assert path.exists(), f"{page.name} links to a missing file: {target}"
