"""`python -m rlpipe.report <run_dir | multirun_dir>`: the reports of finished or killed runs,
rebuilt from their files.

- a run directory (it has `.hydra/config.yaml`): its `health_report.md` and `health_*.png`,
  written again from summary.json, tb/, lifecycle.sqlite and the rest (a run killed with -9
  has no summary.json; the report says what is missing and builds the rest);
- a multirun directory (its children are runs with `.hydra/overrides.yaml`):
  `comparison.md` and `comparison_*.png`, every job side by side.

Exit codes: 0 done, 2 when the directory is neither (one paragraph says so), 130 / 143 when
SIGINT / SIGTERM stopped it (one line, rlpipe.interrupts; every file it wrote is whole: each
takes its name once written, so the others are still an earlier report's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlpipe.interrupts import stops_at_once

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlpipe.report", description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a run directory or a multirun directory")
    args = p.parse_args(argv)
    with stops_at_once("rlpipe.report", args.path, "each file it wrote is whole, the others are an earlier report's"):
        return report(args.path)


def report(path: Path) -> int:
    from rlpipe.report.jobs import is_run_dir, job_dirs

    if is_run_dir(path):
        from rlpipe.telemetry.health import write_health_report

        report = write_health_report(path)
        pngs = sorted(path.glob("health_*.png"))
        print(f"rlpipe.report: wrote {report} and {len(pngs)} plot(s)")
        return 0
    if job_dirs(path):
        from rlpipe.report.compare import write_comparison

        report, plots = write_comparison(path)
        print(
            f"rlpipe.report: wrote {report} ({len(job_dirs(path))} jobs) and {len(plots)} plot(s): "
            + ", ".join(p.name for p in plots)
        )
        return 0
    what = (
        "does not exist"
        if not path.exists()
        else (
            "is neither a run directory (no .hydra/config.yaml) nor a multirun directory (no child "
            "folder with .hydra/overrides.yaml)"
        )
    )
    print(
        f"rlpipe.report: {path} {what}. Pass a run's folder (outputs/<date>/<time>/) or a "
        "multirun's (multirun/<date>/<time>/, or the hydra.sweep.dir you gave).",
        file=sys.stderr,
    )
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
