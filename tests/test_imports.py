"""Imports point one way (docs/architecture.md, Package layers).

Every import statement of the package, lazy ones inside functions included, is read with
`ast` and checked against the layer table below. Imports under `if TYPE_CHECKING:` are left
out: they are annotations, not dependencies at run time. A new module must be given a layer
here, so the table stays the whole picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rlpipe"

# Modules every layer may use; they import nothing of rlpipe outside this set.
BASE = (
    "rlpipe",
    "rlpipe.spec",
    "rlpipe.protocol",
    "rlpipe.redis_client",
    "rlpipe.files",
    "rlpipe.procs",
    "rlpipe.proctree",
    "rlpipe.outputlog",
    "rlpipe.cadence",
    "rlpipe.bounded",
    "rlpipe.heap",
    "rlpipe.chaos_faults",
    "rlpipe.lifecycle",
    "rlpipe.interrupts",
)
# Neutral modules that import no other base module, and the one each may import all the same
# (docs/architecture.md: the recovery report reads the faults' healing rules in their classes).
ISOLATED = {"rlpipe.lifecycle": {"rlpipe.chaos_faults"}, "rlpipe.chaos_faults": set()}

# layer -> the layers it may import (its own layer is always allowed).
ALLOWED = {
    "base": set(),
    "native": set(),
    "shm": {"native", "base"},
    "envs": {"shm", "native", "base"},
    "worker": {"envs", "shm", "native", "base"},
    "config": {"worker", "envs", "shm", "native", "base"},  # the Hydra schema and validation:
    # it checks values against what the layers offer
    "telemetry": {"base"},  # reads run files and public APIs only
    "learner": {"config", "worker", "envs", "shm", "native", "base"},
    "supervisor": {"telemetry", "learner", "config", "worker", "envs", "shm", "native", "base"},
    "ranks": {"supervisor", "telemetry", "learner", "config", "worker", "envs", "shm", "native", "base"},
    # torchrun ranks: the Ranks run mode; the driver holds
    # it as a supervisor.runmode.RunMode without importing it
    "app": {"ranks", "supervisor", "telemetry", "learner", "config", "worker", "envs", "shm", "native", "base"},
}
SUBPACKAGES = ("native", "shm", "envs", "worker", "learner", "supervisor", "ranks", "telemetry")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module in BASE or any(module.startswith(b + ".") for b in BASE[1:]):
        return "base"
    if len(parts) >= 2 and parts[1] in SUBPACKAGES:
        return parts[1]
    if module in (
        "rlpipe.config",
        "rlpipe.config_checks",
        "rlpipe.config_compat",
        "rlpipe.config_errors",
        "rlpipe.process_layout",
        "rlpipe.mix_learner",
    ):
        return "config"
    if module in ("rlpipe.app", "rlpipe.__main__", "rlpipe.sweep_check", "rlpipe.run_dir_guard"):
        return "app"  # the CLI, and its Hydra callbacks (checks before Hydra writes anything)
    if len(parts) >= 2 and parts[1] in ("eval", "report"):  # after-the-run CLIs on top of it all
        return "app"
    if len(parts) >= 2 and parts[1] == "vector":  # the engine for any learner (a VectorEnv), beside eval
        return "app"
    raise AssertionError(f"{module} has no layer: add it to tests/test_imports.py")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str):
    """(line, imported module) for every rlpipe import outside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "rlpipe":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "rlpipe":
                continue
            for alias in node.names:  # `from rlpipe import redis_client`: a submodule
                sub = f"{target}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").is_file() or (
                    PACKAGE.parent / Path(*sub.split("."))
                ).is_dir()
                yield node.lineno, sub if is_module else target
        stack.extend(ast.iter_child_nodes(node))


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "conf" in path.relative_to(PACKAGE).parts:
            continue
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        mine = layer_of(name)
        for line, target in sorted(set(_imports(ast.parse(path.read_text(), str(path)), package))):
            theirs = layer_of(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {mine} imports {target} ({theirs})")
    return bad


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        if "conf" not in path.relative_to(PACKAGE).parts:
            layer_of(module_name(path))


def test_imports_point_one_way():
    bad = upward_imports()
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_lifecycle_log_and_the_chaos_faults_import_nothing_else_of_rlpipe():
    bad = []
    for name, allowed in ISOLATED.items():
        root = PACKAGE.parent / Path(*name.split("."))
        paths = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
        for path in paths:
            mod = module_name(path)
            package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
            for line, target in sorted(set(_imports(ast.parse(path.read_text(), str(path)), package))):
                if not (target == name or target.startswith(name + ".")) and target not in allowed:
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target}")
    assert not bad, "\n".join(bad)


def test_the_layer_table_has_no_cycle():
    def visit(layer: str, path: tuple[str, ...]) -> None:
        assert layer not in path, f"layer cycle: {' -> '.join(path + (layer,))}"
        for below in ALLOWED[layer]:
            visit(below, path + (layer,))

    for layer in ALLOWED:
        visit(layer, ())
    assert not any("app" in allowed for allowed in ALLOWED.values())
