"""A user's own modules that register environments, algorithms, or teacher and judge backends
(`python -m jobs.train --plugin MODULE`). The driver imports them before it validates the config,
and every worker process of the job imports them before any actor code runs (Ray's
`worker_process_setup_hook`), so a name registered by the module alone is known wherever it is
looked up: rollout workers, learner ranks, services. The modules must be importable on every
node: installed, on PYTHONPATH, or in a `ray job submit --working-dir`."""

from __future__ import annotations

import importlib
import os

PLUGINS_VAR = "APPRENTICE_PLUGINS"
"""Comma-separated module names, set in the job's runtime env for its worker processes."""


def import_plugins(modules: tuple[str, ...] | None = None) -> None:
    """Import `modules` (default: those $APPRENTICE_PLUGINS names: the worker processes' hook);
    ValueError naming a module that does not import."""
    names = modules if modules is not None else tuple(m for m in os.environ.get(PLUGINS_VAR, "").split(",") if m)
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"--plugin {name}: the module does not import ({exc}); it must be installed, on "
                             f"PYTHONPATH, or in the job's working dir") from None


def plugins_runtime_env(modules: tuple[str, ...]) -> dict:
    """The runtime env entries that import `modules` in every worker process of the job."""
    if not modules:
        return {}
    return {"env_vars": {PLUGINS_VAR: ",".join(modules)}, "worker_process_setup_hook": f"{__name__}.import_plugins"}
