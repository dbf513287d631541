"""`eval/returns.json` and `eval/returns.md`: each type's returns under the trained policy
(deterministic and stochastic) beside its random-action return."""

from __future__ import annotations

import json
from pathlib import Path

from rlpipe.files import atomic_write


def _num(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"  # -0.0418, not -0.0


def _cell(s: dict) -> str:
    if not s or s.get("mean") is None:
        return f"no episode finished ({s.get('cut', 0)} cut)" if s else "-"
    text = f"{_num(s['mean'])} ± {_num(s['std'])} [{_num(s['min'])}, {_num(s['max'])}]"
    return text + (f", {s['cut']} cut" if s.get("cut") else "")


def type_line(name: str, entry: dict) -> str:
    """One type's three means, rounded as the table rounds them: the line a log that is no
    terminal gets as each type finishes (it had printed -1021.949207601088 and None)."""

    def mean(stats: dict | None) -> str:
        value = (stats or {}).get("mean")
        return "no episode" if value is None else _num(value)

    return (
        f"{name}: deterministic {mean(entry['deterministic'])}, stochastic {mean(entry['stochastic'])}, "
        f"random {mean(entry.get('random'))}"
    )


def markdown(result: dict) -> str:
    lines = [
        f"# Evaluation of {result['run_dir']}",
        "",
        f"Weights: `{result['weights']}` ({result['env_steps']:,} env steps). "
        f"{result['episodes']} episodes per type and mode; returns are the env's own "
        "(no reward normalization). Cells: mean ± std [min, max]; a cut episode (the env "
        "raised, broke the contract, or ran past --max-steps) is counted, not averaged.",
        "",
        "| type | deterministic | stochastic | random | det. over random | video |",
        "|---|---|---|---|---|---|",
    ]
    for name, t in result["types"].items():
        det, rnd = t["deterministic"], t.get("random") or {}
        over = (det["mean"] - rnd["mean"]) if det.get("mean") is not None and rnd.get("mean") is not None else None
        video = (
            f"[{Path(t['video']).name}]({Path(t['video']).name})" if t.get("video") else (t.get("video_note") or "-")
        )
        lines.append(
            f"| {name} | {_cell(det)} | {_cell(t['stochastic'])} | "
            f"{_num(rnd.get('mean'))} ({rnd.get('source', 'none')}) | {_num(over)} | {video} |"
        )
    return "\n".join(lines) + "\n"


def write(out_dir: Path, result: dict) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "returns.json", out_dir / "returns.md"
    for path, text in zip(paths, (json.dumps(result, indent=2) + "\n", markdown(result))):
        atomic_write(path, text)  # its temporary name holds this pid: a stop removes it (rlpipe.interrupts)
    return paths
