"""Markdown formatting of the health report: values (a missing one says so) and tables."""

from __future__ import annotations

import math
from typing import Any

MISSING = "missing"


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if abs(v) >= 1000:
            return f"{v:,.1f}"
        return f"{round(v, digits):g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {fmt(x, digits)}" for k, x in v.items()) or "-"
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[Any]], right: set[int] | None = None) -> str:
    right = set(range(1, len(header))) if right is None else right
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("--:" if i in right else "---" for i in range(len(header))) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in row) + " |")
    return "\n".join(lines)


def types_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
