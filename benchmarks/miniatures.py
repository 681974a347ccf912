"""Every shipped GPU preset in miniature, one after another: the check before a GPU run.

For each `jobs/configs/*_gpu8.yaml`: `python -m jobs.train --config PRESET --miniature` (2 learner
steps, an evaluation, a checkpoint and the HF export, through the preset's plan, algorithm,
dtypes and engines; jobs/miniature.py), its wall time, the time to its first learner step, and
whether its weights were published in the preset's dtype. One line per preset, then

    RESULT presets=N passed=P wall_s=... slowest_s=... first_step_s_max=...

A remote teacher is served here, as a user would run it: the tiny teacher behind vLLM's
OpenAI-compatible server on 127.0.0.1 (models.vllm_server), and `teacher.remote.url` points at
it. ALFWorld presets need its games ($ALFWORLD_DATA, or --alfworld-data); a preset whose
training split is not there (ALFWorld's `train` is not in the evaluation archive) trains on the
first split that is, and its line says so. A preset that cannot run here is reported, never
silently left out.

    python benchmarks/miniatures.py [--only babyai_opd] [--alfworld-data DIR] [--keep-runs DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def remote_teacher_args(stack) -> list[str]:
    from models.vllm_server import ServerConfig, VLLMServer
    from jobs.miniature import CONTEXT_TOKENS, TEACHER
    from models.loading import ModelConfig

    server = stack.enter_context(VLLMServer(ServerConfig(model=ModelConfig(path=TEACHER), max_model_len=CONTEXT_TOKENS)))
    server.wait_ready()
    return [f"teacher.remote.url={server.url}", "teacher.remote.served_model=null", "teacher.remote.api_key_env=null"]


def alfworld_args(config, data: Path | None) -> tuple[list[str], str]:
    """Overrides pointing the preset at the games here, and a note when its split is absent."""
    from envs.registry import make_env

    if data is None:
        raise ValueError("no ALFWorld games: set $ALFWORLD_DATA or pass --alfworld-data")
    os.environ["ALFWORLD_DATA"] = str(data)
    splits = make_env(config.env).splits
    if config.rollout.split in splits:
        return [], ""
    return [f"rollout.split={splits[0]}"], f" (rollout.split {config.rollout.split} absent: {splits[0]})"


def main() -> int:
    from contextlib import ExitStack

    from cluster.local import configure_loopback, free_port
    from jobs.config import load_config
    from jobs.train import JobConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", default=[], help="preset name prefix (repeatable)")
    parser.add_argument("--alfworld-data", type=Path, default=os.environ.get("ALFWORLD_DATA") or None)
    parser.add_argument("--keep-runs", type=Path, help="write the runs here (default: a temporary directory)")
    parser.add_argument("--timeout-s", type=float, default=1200)
    args = parser.parse_args()
    configure_loopback()
    presets = sorted((ROOT / "jobs" / "configs").glob("*_gpu8.yaml"))
    if args.only:
        presets = [p for p in presets if any(p.name.startswith(prefix) for prefix in args.only)]
    runs = args.keep_runs or Path(tempfile.mkdtemp(prefix="apprentice-miniatures-"))
    rows = []
    for preset in presets:
        name = preset.name.removesuffix(".yaml")
        config = load_config(JobConfig, preset)
        note = ""
        with ExitStack() as stack:
            try:
                extra = []
                if config.teacher is not None and config.teacher.backend == "remote":
                    extra += remote_teacher_args(stack)
                if config.env.name == "alfworld":
                    overrides, note = alfworld_args(config, args.alfworld_data)
                    extra += overrides
            except ValueError as exc:
                print(f"{name:<40} NOT RUN: {exc}", flush=True)
                rows.append((name, False, 0.0, None))
                continue
            command = [sys.executable, "-m", "jobs.train", "--config", str(preset), "--miniature",
                       f"run.dir={runs / name}", f"run.metrics_port={free_port()}", *extra]
            start = time.perf_counter()
            env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
            proc = subprocess.Popen(command, cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            timer = threading.Timer(args.timeout_s, proc.terminate)  # SIGTERM: the job stops and says so
            timer.start()
            first_step, lines = None, []
            for line in proc.stdout:
                lines.append(line)
                if first_step is None and line.startswith("step "):
                    first_step = time.perf_counter() - start
            proc.wait()
            timer.cancel()
            wall = time.perf_counter() - start
        out = "".join(lines)
        published = re.search(r"weights published in ([\w/]+)", out)
        ok = proc.returncode == 0 and '"final_version": 2' in out and (runs / name / "hf" / "config.json").is_file()
        dtype_ok = published is not None and published.group(1) == config.model.dtype
        ok = ok and dtype_ok
        status = "ok" if ok else f"FAILED (exit {proc.returncode})"
        print(f"{name:<40} {status:<18} wall {wall:6.0f} s  first step {first_step or float('nan'):6.0f} s  "
              f"published {published.group(1) if published else '-'}{note}", flush=True)
        if not ok:
            print("".join(line for line in lines[-40:] if "WARNING" not in line), flush=True)
        rows.append((name, ok, wall, first_step))
    walls = [r[2] for r in rows if r[1]]
    firsts = [r[3] for r in rows if r[1] and r[3] is not None]
    print(f"RESULT presets={len(rows)} passed={sum(r[1] for r in rows)} wall_s={sum(r[2] for r in rows):.0f} "
          f"slowest_s={max(walls, default=0):.0f} first_step_s_max={max(firsts, default=0):.0f}", flush=True)
    return 0 if all(r[1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
