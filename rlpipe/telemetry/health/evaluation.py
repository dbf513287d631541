"""The health report's evaluation sections: what `python -m rlpipe.eval` left in eval/, and the
rounds of evaluation during training (eval/history.jsonl). A part of `Report` (sections.py),
kept apart by subject; they use its `run` and `add`."""

from __future__ import annotations

from rlpipe.telemetry.health.markdown import fmt, md_table
from rlpipe.telemetry.health.plots import PLOT_RETURNS


class EvaluationSections:
    def _evaluation(self) -> None:
        """Links to what `python -m rlpipe.eval` left in eval/, when it was run."""
        ev = self.run.run_dir / "eval"
        films = sorted(ev.glob("*.mp4")) if ev.is_dir() else []
        if not (ev / "returns.md").is_file() and not films:
            self.add(
                "",
                "Evaluation: none yet (`python -m rlpipe.eval <run_dir> --video` plays the trained "
                "policy per type and films it).",
            )
            return
        parts = []
        if (ev / "returns.md").is_file():
            parts.append(
                "returns of the trained policy per type, deterministic and stochastic, beside "
                "random: [eval/returns.md](eval/returns.md)"
            )
        if films:
            parts.append("videos: " + ", ".join(f"[{p.stem}](eval/{p.name})" for p in films))
        self.add("", "Evaluation (`python -m rlpipe.eval`): " + "; ".join(parts) + ".")

    def eval_rounds(self) -> None:
        """The last round of evaluation during training, beside the first (eval/history.jsonl)."""
        rounds = self.run.eval_rounds
        if not rounds:
            self.add(
                f"eval/history.jsonl is {self.run.eval_note}: no evaluation during training "
                "(`eval.interval_s` sets its cadence; it is null, off, unless a stage turns it on)."
            )
            return
        first, last = rounds[0], rounds[-1]
        took = f", took {fmt(last.get('eval_s'))} s" if last.get("eval_s") is not None else ""
        self.add(
            f"{len(rounds)} round(s) of deterministic episodes per env type, each on envs built "
            f"for it, with the policy of that moment. The last: weights of {fmt(last['env_steps'])} "
            f"env steps, {fmt(last.get('wall_s'))} s into the run{took}; a cut episode (past "
            "`eval.budget_s` or `eval.max_steps`, or its env failed) is counted, not averaged.",
            "",
        )
        rows = []
        for name, t in last["types"].items():
            t0 = (first["types"].get(name) or {}) if len(rounds) > 1 else {}
            rows.append(
                [name, t.get("mean"), t.get("std"), t.get("episodes"), t.get("cut"), t0.get("mean") if t0 else "-"]
            )
        self.add(
            md_table(
                ["env type", "mean", "std", "episodes", "cut", f"first round ({fmt(first['env_steps'])} steps)"], rows
            )
        )
        counts = [
            f"{what} {int(self.run.scalars[f'eval_rounds/{what}'].last)}"
            for what in ("skipped", "failed")
            if f"eval_rounds/{what}" in self.run.scalars
        ]
        if counts:
            self.add(
                "",
                "Rounds " + ", ".join(counts) + " (TensorBoard `eval_rounds/`): a round due while "
                "the last still ran is skipped; a failed one is in the run's log.",
            )
        self.add("", f"The curves are drawn beside the training returns in {PLOT_RETURNS} (above).")
