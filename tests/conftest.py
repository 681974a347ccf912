"""Shared test settings: one torch thread, a per-session model cache, the gpu marker."""

from __future__ import annotations

import os

# Two shared cores: spinning OpenMP threads slow everything down badly.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest

ALFWORLD_ARCHIVE = Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld" / "alfworld-json_2.1.1-valid.tar.xz"
"""ALFWorld's official 2.1.1 evaluation games, next to the checkout (never committed into it)."""


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory) -> str:
    """Tiny models are built once per session into a fresh cache (tests the factory too)."""
    path = str(tmp_path_factory.mktemp("apprentice-cache"))
    os.environ["APPRENTICE_CACHE"] = path
    return path


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def alfworld_data(tmp_path_factory) -> Path:
    """An `alfworld-download` layout: $ALFWORLD_DATA when it has one, else the archive unpacked once
    per session. Rebuilt games land in the session's model cache, so each is rebuilt once."""
    import tarfile

    pytest.importorskip("alfworld", reason="needs the alfworld extra (pip install -e '.[alfworld]'; CI installs it)")
    env_root = os.environ.get("ALFWORLD_DATA")
    if env_root and (Path(env_root) / "json_2.1.1").is_dir():
        return Path(env_root)
    if not ALFWORLD_ARCHIVE.is_file():
        pytest.skip(f"no ALFWorld games: set $ALFWORLD_DATA or provide {ALFWORLD_ARCHIVE}")
    root = tmp_path_factory.mktemp("alfworld-data")
    with tarfile.open(ALFWORLD_ARCHIVE) as archive:
        archive.extractall(root, filter="data")
    return root / "alfworld"


@pytest.fixture(scope="session")
def scienceworld_ready() -> None:
    """ScienceWorld needs its extra and a Java runtime; CI has both (.ci/run installs them)."""
    import shutil

    pytest.importorskip("scienceworld", reason="needs the scienceworld extra (pip install -e '.[scienceworld]'; CI installs it)")
    if shutil.which("java") is None:
        pytest.skip("ScienceWorld needs a Java runtime (>= 8) on PATH: cluster/ensure_java.sh installs one")
