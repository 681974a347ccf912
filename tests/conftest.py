"""Shared test settings: one torch thread, a per-session model cache, the gpu marker."""

from __future__ import annotations

import os

# Two shared cores: spinning OpenMP threads slow everything down badly.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


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
