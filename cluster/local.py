"""Start an embedded Ray node with every listener on loopback.

On a single machine Ray binds the host's external interface unless
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is in the environment *when ray is imported*
(docs/architecture.md). The embedded default and the tests must keep all traffic on 127.0.0.1,
and must not write the auth token that later breaks `ray job submit` against a head
started with `ray start --head`. Entry points call `configure_loopback()` before importing
ray; `init_local_ray` checks the result and refuses to run off loopback.
"""

from __future__ import annotations

import logging
import os

LOOPBACK_ENV: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}
"""Environment every process of a local run needs, set before `import ray`."""
WORKER_ENV: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Thread settings for actors: two shared cores must not spin."""
LOOPBACK_IP = "127.0.0.1"


def free_port(host: str = LOOPBACK_IP) -> int:
    """A port nothing listens on now (the caller binds it next)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def configure_loopback() -> None:
    """Put LOOPBACK_ENV into this process's environment (values already set are kept)."""
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)


def init_local_ray(num_cpus: int, include_dashboard: bool = False, dashboard_port: int = 8265,
                   namespace: str | None = None, runtime_env: dict | None = None, logging_level: int = logging.INFO):
    """Start an embedded Ray node bound to 127.0.0.1; returns ray.init's context. `runtime_env`:
    the job's own entries (its env_vars join the loopback ones); `logging_level`: the driver's Ray logger's."""
    if num_cpus < 1:
        raise ValueError(f"num_cpus must be >= 1, got {num_cpus}")
    configure_loopback()
    import ray

    context = ray.init(
        address="local",  # always a new node: never attach to a cluster that `ray start` left running
        namespace=namespace,
        logging_level=logging_level,
        num_cpus=num_cpus,
        num_gpus=0,
        _node_ip_address=LOOPBACK_IP,
        include_dashboard=include_dashboard,
        # A job's actors run in workers started with its runtime env; the default workers Ray
        # starts for a first driver are never used (docs/architecture.md, "Costs").
        _system_config={"prestart_worker_first_driver": False},
        dashboard_host=LOOPBACK_IP,
        dashboard_port=dashboard_port,
        runtime_env={**(runtime_env or {}),
                     "env_vars": {**LOOPBACK_ENV, **WORKER_ENV, **(runtime_env or {}).get("env_vars", {})}},
    )
    node_ip = context.address_info["node_ip_address"]
    if node_ip != LOOPBACK_IP:
        ray.shutdown()
        raise RuntimeError(
            f"Ray bound {node_ip}, not {LOOPBACK_IP}: ray was imported before "
            f"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set; call cluster.local.configure_loopback() "
            f"before the first `import ray` (or export the variable)")
    return context
