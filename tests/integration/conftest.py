"""One local Ray per test session (num_cpus=2, loopback only)."""

from __future__ import annotations

import pytest

from cluster.local import configure_loopback

configure_loopback()  # before anything imports ray


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from cluster.local import init_local_ray

    context = init_local_ray(num_cpus=2)
    yield context
    ray.shutdown()
