"""The embedded Ray stays on loopback; envs and tiny models work inside actors."""

import os
import subprocess



def _listening_ports_of(pids: set[int]) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    addresses = []
    for line in out.splitlines():
        fields = line.split()
        if any(f"pid={pid}," in fields[-1] for pid in pids):
            addresses.append(fields[3])
    return addresses


def test_every_ray_listener_is_on_loopback(ray_session):
    import ray

    assert ray_session.address_info["node_ip_address"] == "127.0.0.1"
    assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    assert ray.cluster_resources()["CPU"] == 2

    @ray.remote(num_cpus=0)
    def worker_pid():
        return os.getpid(), os.environ.get("OMP_WAIT_POLICY"), ray.util.get_node_ip_address()

    pid, omp, ip = ray.get(worker_pid.remote())
    assert (omp, ip) == ("PASSIVE", "127.0.0.1")
    session_dir = ray_session.address_info["session_dir"]
    ray_pids = {pid}
    for proc in os.listdir("/proc"):
        if proc.isdigit():
            try:
                cmdline = open(f"/proc/{proc}/cmdline", "rb").read()
            except OSError:
                continue
            if session_dir.encode() in cmdline or b"gcs_server" in cmdline or b"raylet" in cmdline:
                ray_pids.add(int(proc))
    addresses = _listening_ports_of(ray_pids)
    assert addresses, "found no Ray listener to check"
    off_loopback = [a for a in addresses if not (a.startswith("127.0.0.1:") or a.startswith("[::ffff:127.0.0.1]:"))]
    assert not off_loopback, off_loopback


def test_env_and_tiny_model_inside_actors(ray_session, model_cache):
    """Two actors build the same tiny model concurrently: one directory, identical weights."""
    import ray

    @ray.remote(num_cpus=0.5)
    class Probe:
        def __init__(self, cache):
            os.environ["APPRENTICE_CACHE"] = cache

        def model(self, seed):
            from models.loading import ModelConfig, resolve_model_dir

            directory = resolve_model_dir(ModelConfig(path="tiny:nano", seed=seed))
            return str(directory), (directory / "model.safetensors").read_bytes()

        def episode(self, seed):
            from envs.babyai_text import BabyAITextEnv

            return BabyAITextEnv().reset(seed, "eval50")

    probes = [Probe.remote(model_cache) for _ in range(2)]
    built = ray.get([p.model.remote(17) for p in probes])
    assert built[0] == built[1]
    from envs.babyai_text import BabyAITextEnv

    assert ray.get(probes[0].episode.remote(7)) == BabyAITextEnv().reset(7, "eval50")
