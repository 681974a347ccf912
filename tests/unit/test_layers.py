"""The layout's rules (docs/architecture.md, Layout): imports run downward only (a package
imports from the layers below it and from itself, never from one above, so no two packages
import each other); the driver and the workers name no algorithm's lifecycle; no function is
longer than a screen."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["cluster", "envs", "models", "buffer", "learner", "actors", "teacher", "judge", "jobs"]
"""Bottom first."""


def imported_packages(path: Path) -> set[str]:
    """The project packages a module imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else \
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in LAYERS)
    return found


def test_every_import_runs_downward():
    upward = []
    for layer, package in enumerate(LAYERS):
        for path in sorted((ROOT / package).rglob("*.py")):
            upward += [f"{path.relative_to(ROOT)} imports {other}" for other in imported_packages(path)
                       if LAYERS.index(other) > layer]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom envs.registry import make_env\n\ndef f():\n    from jobs.train import main\n")
    assert imported_packages(module) == {"envs", "jobs"}


def test_the_driver_and_the_workers_leave_the_teacher_schedule_to_the_algorithm():
    """RetireOPD's retirement is its `TeacherSchedule` (learner/retirement.py): jobs/ and actors/
    call the schedule's hooks and never name it."""
    named = [f"{path.relative_to(ROOT)}:{number}" for package in ("jobs", "actors")
             for path in sorted((ROOT / package).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if "retire" in line]
    assert not named, named


MAX_FUNCTION_LINES = 60


def test_no_function_is_longer_than_a_screen():
    """Outside benchmarks/ (scripts that print one measurement each)."""
    packages = [path for path in sorted(ROOT.iterdir()) if (path / "__init__.py").is_file() or path.name == "tests"]
    names = {path.name for path in packages}
    assert {"jobs", "learner", "tests"} <= names and "benchmarks" not in names
    long = []
    for path in (path for package in packages for path in sorted(package.rglob("*.py"))):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
