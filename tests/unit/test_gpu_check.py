"""The GPU check script at the tiny shape on CPU: both GPU benchmarks run one step and print
their RESULT lines, so the script the device runs is exercised in CI."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_smoke(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    log = (tmp_path / "log.txt").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr + log[-3000:]
    results = [dict(kv.split("=") for kv in line.split()[1:])
               for line in (tmp_path / "results.txt").read_text().splitlines() if line.startswith("RESULT")]
    assert len(results) == 3
    learner_opd, learner_grpo, rollout = results
    assert (learner_opd["loss"], learner_grpo["loss"]) == ("opd", "grpo")
    for r in (learner_opd, learner_grpo):
        assert float(r["tokens_per_s"]) > 0 and 0 < float(r["mfu"]) < 1 and float(r["peak_mem_gib"]) > 0
    assert float(rollout["decode_tokens_per_s"]) > 0 and float(rollout["score_tokens_per_s"]) > 0
    assert re.search(r"\d+ skipped", log)  # the gpu-marked tests were collected (and skipped here)
