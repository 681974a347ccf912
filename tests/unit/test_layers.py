"""Imports run downward only (docs/architecture.md, Layout): a package imports from the layers
below it and from itself, never from one above, so no two packages import each other."""

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
