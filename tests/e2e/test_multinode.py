"""The production path in miniature on a simulated multi-node cluster.

A head and two worker nodes of 4 declared GPUs each (Ray's `cluster_utils.Cluster`: three
raylets on 127.0.0.1, distinct node ids), and the gpu-8 OPD preset submitted to it in
miniature with its GPUs kept as Ray resources: the placement groups schedule as on a real
2 x 4-GPU cluster, while every actor finds no CUDA and runs on CPU with gloo. The learner ranks
are spread over the two nodes, so they meet across nodes at rank 0's node address.
"""

import re
import subprocess
import sys

import pytest
import torch

from cluster.local import configure_loopback, free_port
from tests.e2e.test_train_job import ROOT, job_env

PRESET = "jobs/configs/babyai_opd_qwen3_gpu8.yaml"


@pytest.fixture
def cluster():
    configure_loopback()
    from ray.cluster_utils import Cluster

    head = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": True,
        "dashboard_host": "127.0.0.1", "dashboard_port": free_port()})
    try:
        gpu_nodes = [head.add_node(num_cpus=1, num_gpus=4, node_ip_address="127.0.0.1") for _ in range(2)]
        head.wait_for_nodes()
        yield head, {node.node_id for node in gpu_nodes}
    finally:
        head.shutdown()


def actors_by_name(address: str, namespace: str) -> dict[str, dict]:
    """Every actor the run created in its namespace (dead ones too), from Ray's state API."""
    from ray.util.state import list_actors

    rows = list_actors(address=address, filters=[("ray_namespace", "=", namespace)], limit=1000, detail=True,
                       raise_on_missing_output=False)
    return {row["name"]: row for row in (r.__dict__ if hasattr(r, "__dict__") else r for r in rows) if row["name"]}


def test_the_gpu8_opd_preset_in_miniature_trains_checkpoints_resumes_and_exports_across_two_nodes(cluster, tmp_path):
    head, gpu_nodes = cluster
    run_dir = tmp_path / "opd_gpu8"
    args = [sys.executable, "-m", "jobs.train", "--config", PRESET, "--miniature", "--keep-gpus",
            f"cluster.address={head.address}", "cluster.plan.spread_learner=true", f"run.dir={run_dir}",
            f"run.metrics_port={free_port()}"]
    first = subprocess.run(args, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=900)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-6000:]
    assert "rollout  4 x (0.225 CPU, 1 GPU)" in out and "learner  2 x (0.225 CPU, 1 GPU)" in out
    assert re.search(r"weights published in bfloat16: [\d.]+ MiB", out)
    assert "step    1 " in out and "step    2 " in out and '"final_version": 2' in out

    # Placement, from Ray's state API: the learner ranks on the two GPU nodes, one each; every
    # GPU bundle (4 rollout, 2 teacher, 2 learner) on a GPU node, 4 per node; the head holds none.
    actors = actors_by_name(head.address, f"apprentice-{run_dir.name}")
    learners = [actors[f"learner-{r}"]["node_id"] for r in range(2)]
    assert set(learners) == gpu_nodes
    gpu_actors = [actors[name]["node_id"] for name in
                  [f"worker-{i}" for i in range(4)] + [f"teacher-{j}" for j in range(2)] + ["learner-0", "learner-1"]]
    assert sorted(gpu_actors.count(node) for node in gpu_nodes) == [4, 4]

    # The resume continues both learner ranks' sharded checkpoint on the two nodes, with one
    # rollout worker and one teacher instead of four and two, both on HF instead of vLLM (changes
    # `--allow-change` accepts, tests/unit/test_config.py): what a resume adds is on the learner's
    # side, each vLLM engine costs ~20 s of the two cores here, and the first run placed all eight
    # actors and published to all four vLLM engines.
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    smaller = ["cluster.plan.rollout.count=1", "cluster.plan.teacher.count=1", "rollout.engine=hf",
               "teacher.backend=hf"]
    resumed = subprocess.run([sys.executable, "-m", "jobs.train", "--resume", str(run_dir), "--allow-change",
                              ",".join(key.partition("=")[0] for key in smaller), "run.steps=3", *smaller,
                              f"run.metrics_port={free_port()}"], cwd=ROOT, env=job_env(), capture_output=True,
                             text=True, timeout=900)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-6000:]
    assert "rollout  1 x (0.225 CPU, 1 GPU)" in out and "learner  2 x (0.225 CPU, 1 GPU)" in out
    assert "at version 2" in out and "step    3 " in out and "step    2 " not in out and '"final_version": 3' in out

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf", local_files_only=True)
    assert model.dtype == torch.bfloat16
    logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits.float()).all()
