"""`python -m jobs.train` for real: the embedded default submitted with `ray job submit` to a head
the test starts and stops (its metrics endpoint, Parquet, checkpoint, then resume), and short
runs of the other algorithms and configs."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import yaml

from cluster.local import LOOPBACK_ENV, free_port
from jobs.report import FIGURES
from jobs.status import live_status_lines

ROOT = Path(__file__).resolve().parents[2]
IN_PROCESS = ["rollout.vllm.in_process=true"]
DEFAULT_ENGINE = "rollout.vllm.in_process=false"
SHORT = ["--config", "jobs/configs/babyai_opd_tiny.yaml", "model.path=tiny:nano", "buffer.batch_size=16",
         "rollout.loop.max_turns=3", "rollout.sampling.max_new_tokens=16", "run.eval_every=2", "run.eval_tasks=4",
         "run.checkpoint_every=2", "warm_start.num_episodes=0", "run.report=false", *IN_PROCESS]
"""A short run of the embedded default with the nano model. Its engine core runs in the worker's
own process: an engine starts in half the time (docs/vllm_cpu.md), and most of a short job is
its start. The report a job writes at its end is drawn by the `ray job submit` test's resume
only. The default, a separate engine-core process, is what that test submits (DEFAULT_ENGINE)."""
HF_ENGINE = ["rollout.engine=hf"]
"""For runs whose subject is not the rollout engine (an algorithm, a fault, an environment): the
HF engine starts on ~3 s of CPU where vLLM's in-process engine takes ~12, 8.4 of them importing
vllm (docs/architecture.md, "The test suite's time"), and a short job is mostly its start. vLLM
stays under test where it is the subject or the default a user runs: the `ray job submit` run
(its engine core a separate process), the gpu-8 miniature's first run (four bf16 engines, two
vLLM teachers), the plugin job (in-process, behind the gateway), the served judge, the remote
teacher against the in-process backend, and tests/unit/test_vllm_engine.py; the resumes of the
first two continue on HF (`--allow-change`)."""


def job_env():
    # The head and the job's `python` must be this environment's (where apprentice is installed).
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    return {**os.environ, **LOOPBACK_ENV, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1", "PATH": path}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return response.read().decode()


def listening_addresses(pid: int) -> list[str]:
    """Listening TCP addresses (`ss`) of the process and all its descendants."""
    root = psutil.Process(pid)
    pids = {root.pid} | {p.pid for p in root.children(recursive=True)}
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line.split()[-1] for p in pids)]


def assert_loopback_only(listeners: list[str], metrics_port: int | str) -> None:
    """The metrics endpoint is among the listeners, and every listener is on 127.0.0.1."""
    assert any(a.endswith(f":{metrics_port}") for a in listeners), listeners
    off_loopback = [a for a in listeners if not a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))]
    assert not off_loopback, (off_loopback, listeners)


THIRD_PARTY_WARNING = re.compile(r"\bWARNING\b|Warning:|\[W\d{4} |core_worker\.cc")
"""vLLM's and Ray's logging, Python warnings, torch's c10 warnings, Ray's C++ core worker lines."""


def assert_quiet_console(out: str, run_dir: Path) -> None:
    """The console has no third-party warning (the default run.log_level=error) and few lines,
    while RUN_DIR/logs/workers.log kept the engine's warnings it hid."""
    assert [line for line in out.splitlines() if THIRD_PARTY_WARNING.search(line)] == []
    assert len(out.splitlines()) <= 80, len(out.splitlines())
    kept = (run_dir / "logs" / "workers.log").read_text()
    assert len(THIRD_PARTY_WARNING.findall(kept)) >= 3  # the engine's start prints several


def test_bad_job_config_fails_before_any_actor(tmp_path, capsys):
    from jobs.train import main

    # Errors in the config alone: `main` as `python -m jobs.train` calls it (exit code, stderr),
    # in this process, since they are found before anything starts.
    assert main(["learner.algorithm.name=opd", "teacher=null", f"run.dir={tmp_path}"]) == 2
    assert "needs a teacher" in capsys.readouterr().err
    assert main(["rollout.num_env=3"]) == 2
    assert "unknown key 'rollout.num_env'" in capsys.readouterr().err
    assert main(["--dry-run", "env.name=nope"]) == 2
    # Other tests in this process may have registered environments of their own.
    known = re.search(r"env\.name: unknown environment 'nope'; known environments: \[(.*?)\]",
                      capsys.readouterr().err)
    assert known and {"'alfworld'", "'babyai_text'", "'gateway'", "'scienceworld'"} <= set(known.group(1).split(", "))
    # Checks that need the machine, in the job's own process: still one line each, before Ray or
    # any actor starts.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for override, message in [(f"model.path={tmp_path / 'no_model'}", "is not a local model directory"),
                                  ("run.eval_split=nope", "run.eval_split: environment 'babyai_text' has no split 'nope'"),
                                  (f"run.metrics_port={port}", f"run.metrics_port {port} on 127.0.0.1 is not free")]:
            proc = subprocess.run([sys.executable, "-m", "jobs.train", override, f"run.dir={tmp_path}"], cwd=ROOT,
                                  env=job_env(), capture_output=True, text=True, timeout=120)
            assert proc.returncode == 2 and message in proc.stderr, (override, proc.stderr)
            assert "Traceback" not in proc.stderr and "Started a local Ray instance" not in proc.stderr


def test_the_teacher_building_preset_passes_dry_run():
    proc = subprocess.run([sys.executable, "-m", "jobs.build_teacher", "--config",
                           "jobs/configs/babyai_teacher_qwen3_gpu8.yaml", "--dry-run"],
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "rollout  6 x (2 CPU, 1 GPU)" in proc.stdout, proc.stderr


def readme_commands(heading: str) -> list[str]:
    """The command lines of the first bash block after a README heading."""
    section = (ROOT / "README.md").read_text().split(f"\n{heading}\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def prometheus_binary() -> str:
    """PROMETHEUS_BIN, else what cluster/fetch_prometheus.sh unpacked (README command (2) runs it), else PATH's."""
    found = os.environ.get("PROMETHEUS_BIN") or next(
        (str(p) for p in [ROOT / ".venv/prometheus/usr/bin/prometheus"] if p.exists()), None) or \
        shutil.which("prometheus")
    assert found, "no Prometheus server: run `bash cluster/fetch_prometheus.sh` (Debian/Ubuntu) or set PROMETHEUS_BIN"
    return found


def start_prometheus(tmp_path: Path, driver_port: int) -> tuple[subprocess.Popen, int]:
    """A real Prometheus server with the shipped scrape config; only the driver's port differs
    (a free one), and the scrape interval: the test's six-step job can run its steps within the
    shipped 5 s (it did in CI: no scrape after the first step, so series labelled at the first
    step were never seen). Ray's targets come from the service-discovery file the head writes."""
    config = yaml.safe_load((ROOT / "cluster" / "prometheus.yml").read_text())
    (job,) = [c for c in config["scrape_configs"] if c["job_name"] == "apprentice"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9400"]}]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{driver_port}"]}]
    config["global"]["scrape_interval"] = "1s"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen([prometheus_binary(), f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return server, port


def prometheus_api(port: int, path: str) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]


API_SERVER = "vllm.entrypoints.openai.api_server"


def vllm_descendants(pid: int) -> dict[psutil.Process, str]:
    """vLLM's processes among `pid`'s live descendants, by title: engine cores and their workers
    (`VLLM::EngineCore`, `VLLM::Worker`) and OpenAI-compatible API servers (API_SERVER). Collected
    while a run lives, they are checked after it: a process that outlived its owner is reparented
    to init and no longer anyone's descendant, and the other pytest-xdist worker's runs start
    their own."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for child in children:
        try:
            cmdline = child.cmdline() or [""]
        except psutil.NoSuchProcess:
            continue
        if cmdline[0].startswith("VLLM::"):
            found[child] = cmdline[0]
        elif API_SERVER in cmdline:
            found[child] = API_SERVER
    return found


def assert_all_exit(processes, timeout_s: float = 30) -> None:
    """Every process in `processes` is gone (or a zombie) within `timeout_s`."""
    def alive() -> list[psutil.Process]:
        running = []
        for process in processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
            except psutil.NoSuchProcess:
                continue
        return running

    deadline = time.monotonic() + timeout_s
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def test_a_job_through_ray_job_submit_serves_metrics_checkpoints_and_resumes(tmp_path):
    """README's recipe as written: activate the environment, start a head, submit, (stop). The
    shell's PATH does not hold the environment otherwise, so a recipe that forgets to activate
    it fails here as it does for a user (the job's `python` would be the system one). Only the
    ports (free ones), `--block`/`--no-wait` and the job's length differ; the test stops the head
    it started by its process group instead of `ray stop` (which stops every Ray on the machine).

    The submitted job is the embedded default, short: a small warm start (two of its demonstrations
    in every batch after it), 4 steps with an eval each, checkpoints, W&B offline. While it runs: every listener of the head's processes (Ray's,
    the job's metrics endpoint, vLLM's engine-core process) is on 127.0.0.1, and `jobs.status
    --address` reads the live job. The observability stack with real parts: a Prometheus server
    with the shipped scrape config scrapes the job's driver and Ray's per-node endpoint; every
    series the shipped Grafana dashboard plots must be in Prometheus afterwards. The dashboard's
    actor list has the run's named actors with their reprs. After the head is stopped,
    `python -m jobs.train --resume` continues the run on an embedded node and reports it."""
    run_dir, driver_port = tmp_path / "run", free_port()
    job = submit_to_a_head(tmp_path, run_dir, driver_port)
    # The worker's vLLM engine core ran in processes of its own: none outlives the cluster
    # (cluster/reaper.py; one used to stay under init after this test).
    assert "VLLM::EngineCore" in job.engines.values(), job.engines
    assert_all_exit(job.engines)
    assert_loopback_only(job.listeners, driver_port)
    out = job.out
    assert "ray namespace apprentice-run" in out  # run.dir's name
    assert_quiet_console(out, run_dir)
    live = job.live
    assert re.fullmatch(r"version    \d+", live[1]) and re.fullmatch(r"eval       [01]\.\d{3}(; .*)?", live[2]), live
    # Only the bot's episodes solved within the 3-turn limit are kept; 2 epochs of 4 per step.
    solved = int(re.search(r"warm start: the expert solved (\d+)/16 episodes", out).group(1))
    warm = 2 * -(-solved // 4)
    assert solved > 0 and f"warm start: {warm}/{warm} SFT steps, loss " in out and "sft  " not in out
    assert [r["version"] for r in pq.read_table(run_dir / "warm_start.parquet").to_pylist()] == list(range(1, warm + 1))
    final = warm + 4
    assert 0 <= job.bottom < job.top <= final, (job.bottom, job.top)  # 0: the gauge before the first step
    assert f"step {final:4d}" in out and f'"final_version": {final}' in out
    for name in ("learner_version", "buffer_occupancy", "consumed_staleness_bucket", "opd_reverse_kl",
                 "rollout_tokens_per_s", "weight_sync_seconds", "format_error_rate", "eval_success", "opd_lambda",
                 "rollout_prompt_tokens_per_turn"):
        assert f"apprentice_{name}" in job.scraped, name
    table = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["version"] for r in table] == list(range(warm + 1, final + 1))
    for row in table:
        staleness = [row["version"] - 1 - v for v in row["sample_versions"]]
        assert staleness and max(staleness) <= 2 and min(staleness) >= 0
        assert row["num_past_samples"] == 2  # two of the warm start's demonstrations in every batch
    # Rates are over the episodes that finished during a step (None when none did).
    per_turn = [r["prompt_tokens_per_turn"] for r in table if r["prompt_tokens_per_turn"] is not None]
    assert per_turn and min(per_turn) > 100  # the system turn with the compact tools, at least
    assert any(r["eval_success_by_type"] for r in table)
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{final:06d}"
    resume_on_an_embedded_node(run_dir, warm)


@dataclass
class SubmittedJob:
    """What the `ray job submit` test saw of its job."""

    out: str
    """The job's logs (`ray job logs --follow`)."""
    scraped: str
    """The driver's metrics endpoint, the last scrape after the first step."""
    listeners: list[str]
    """Listening addresses of the head's processes while the job ran."""
    live: list[str]
    """`jobs.status --address` on the live job."""
    engines: dict
    """vLLM's processes among the head's descendants (`vllm_descendants`)."""
    bottom: float
    top: float
    """The least and greatest learner version Prometheus scraped."""


def submit_to_a_head(tmp_path: Path, run_dir: Path, driver_port: int) -> SubmittedJob:
    """README's head, Prometheus beside it, the short job submitted and followed to its end; the
    dashboard's actor list and Prometheus checked while the head lives; the head stopped."""
    activate, start, submit_line, stop = readme_commands("## Submitting to a Ray cluster")
    assert activate == "source .venv/bin/activate" and stop == "ray stop"
    activate = f"source {Path(sys.executable).parent / 'activate'}"  # this test run's environment
    venv_bin = str(Path(sys.executable).parent)
    env = {**job_env(), "PATH": ":".join(p for p in os.environ.get("PATH", "").split(":") if p != venv_bin)}
    gcs, dashboard, ray_metrics, agent = free_port(), free_port(), free_port(), free_port()
    # The agent's port too: its default (52365) is every node's, and a node the other pytest
    # worker runs holds it; an agent that cannot bind it takes no job ("No available agent").
    start = (f"{start} --block --port={gcs} --dashboard-port={dashboard} --num-cpus=2 "
             f"--metrics-export-port={ray_metrics} --dashboard-agent-listen-port={agent} --include-dashboard=true "
             f"--disable-usage-stats")
    head = subprocess.Popen(["bash", "-c", f"{activate} && {start}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    submit_line = submit_line.replace("http://127.0.0.1:8265", f"http://127.0.0.1:{dashboard}")
    assert submit_line.startswith("ray job submit ") and " -- python -m jobs.train --config " in submit_line
    submit_line = submit_line.replace("ray job submit ", "ray job submit --no-wait ", 1)
    # A small warm start too: 16 bot episodes, of which the bot solves a few within 3 turns.
    # An eval at every step: the eval gauge exists from the first step on, not only in the run's
    # last seconds, which a 5 s scrape can miss (it did once in CI).
    overrides = " ".join(SHORT[2:] + [DEFAULT_ENGINE, f"run.dir={run_dir}", "run.steps=4", "run.eval_every=1",
                                      "warm_start.num_episodes=16", "warm_start.epochs=2", "warm_start.batch_episodes=4",
                                      "aggregate.num_demonstration_samples=2",
                                      "run.wandb.project=apprentice-e2e", "run.wandb.mode=offline",
                                      f"run.metrics_port={driver_port}"])
    prometheus = None
    try:
        address = f"http://127.0.0.1:{dashboard}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2)
                break
            except OSError:
                time.sleep(1)
        # Once the head is up (its session directory holds Ray's service-discovery file).
        prometheus, prometheus_port = start_prometheus(tmp_path, driver_port)
        job_id = submit(f"{activate} && {submit_line} {overrides}", env)
        job = follow(job_id, address, head.pid, driver_port)
        check_head_views(job_id, address, prometheus_port)
        seen = prometheus_api(prometheus_port, "query?query=max_over_time(apprentice_learner_version[1h])")
        first = prometheus_api(prometheus_port, "query?query=min_over_time(apprentice_learner_version[1h])")
        (job.top,), (job.bottom,) = [float(v["value"][1]) for v in seen["result"]], \
            [float(v["value"][1]) for v in first["result"]]
        return job
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=60)
        stop_head(head, gcs)


def submit(command: str, env: dict) -> str:
    """The submitted job's id. The head's job agent registers a little after the dashboard
    answers: until then a submit is refused with "No available agent", which asks to try again
    (minutes on two loaded cores)."""
    deadline = time.monotonic() + 300
    while True:
        submitted = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=120)
        if submitted.returncode == 0 or "No available agent" not in submitted.stderr + submitted.stdout \
                or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return re.search(r"Job '(raysubmit_\w+)' submitted", submitted.stdout + submitted.stderr).group(1)


def follow(job_id: str, address: str, head_pid: int, driver_port: int) -> SubmittedJob:
    """The job's logs to its end, and while it runs: its metrics, the head's listeners and vLLM
    processes, and `jobs.status` once an evaluation has run."""
    ray_bin = Path(sys.executable).with_name("ray")
    logs = subprocess.Popen([str(ray_bin), "job", "logs", "--follow", "--address", address, job_id], cwd=ROOT,
                            env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    scraped, listeners, live, engines = "", [], [], {}
    deadline = time.monotonic() + 600
    while logs.poll() is None and time.monotonic() < deadline:
        engines |= vllm_descendants(head_pid)
        try:
            text = scrape(driver_port)
            if re.search(r"apprentice_learner_version \d", text) and "apprentice_eval_success" in text:
                if not scraped:  # the head's Ray, the metrics endpoint and vLLM's engine-core process
                    listeners = listening_addresses(head_pid)
                scraped = text
            if 'apprentice_eval_success{task_type="overall"}' in text:  # an evaluation has run
                live = live_status_lines(f"127.0.0.1:{driver_port}")  # `jobs.status --address` on the live job
        except (OSError, ValueError):  # not serving yet, or gone (live_status_lines says so with ValueError)
            pass
        time.sleep(0.2)
    out, _ = logs.communicate(timeout=60)
    assert logs.returncode == 0, out
    return SubmittedJob(out, scraped, listeners, live, engines, bottom=float("nan"), top=float("nan"))


def check_head_views(job_id: str, address: str, prometheus_port: int) -> None:
    """Ray's job status, the dashboard's Actors page and what Prometheus scraped, while the head lives."""
    ray_bin = Path(sys.executable).with_name("ray")
    namespace = "apprentice-run"  # run.dir's name
    status = subprocess.run([str(ray_bin), "job", "status", "--address", address, job_id], env=job_env(),
                            capture_output=True, text=True, timeout=60)
    assert "succeeded" in (status.stdout + status.stderr).lower(), status.stdout + status.stderr
    # The dashboard's Actors page: every actor of the run named in the run's namespace, with a repr.
    listed = subprocess.run([str(ray_bin), "list", "actors", "--address", address, "--detail", "--format", "json",
                             "--limit", "1000"], env=job_env(), capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    actors = {a["name"]: a for a in json.loads(listed.stdout) if a.get("ray_namespace") == namespace}
    assert {"buffer", "learner-0", "worker-0", "teacher-0"} <= set(actors), sorted(actors)
    # Ray reads a repr once, after __init__: nothing in it may go stale (a version did).
    assert actors["worker-0"]["repr_name"] == "RolloutWorker(worker-0)"
    assert actors["learner-0"]["repr_name"] == "LearnerRank(learner-0)"
    assert actors["teacher-0"]["repr_name"] == "TeacherService(teacher-0, oracle)"
    # Prometheus scraped both targets: the driver's series and the actors' series through Ray
    # (those live on Ray's endpoint only while the actors do, so only a scrape during the run has them).
    names = set(prometheus_api(prometheus_port, "label/__name__/values"))
    grafana = (ROOT / "cluster" / "grafana_dashboard.json").read_text()
    plotted = set(re.findall(r"\b(?:ray_)?apprentice_\w+", grafana)) - other_algorithms_gauges("opd")
    assert plotted and plotted <= names, f"dashboard series Prometheus never scraped: {sorted(plotted - names)}"
    wanted = {"apprentice_learner_version", "apprentice_rollout_tokens_per_s", "apprentice_buffer_occupancy",
              "apprentice_consumed_staleness_bucket", "ray_apprentice_learner_version",
              "ray_apprentice_rollout_tokens_total", "ray_apprentice_consumed_staleness_bucket"}
    assert wanted <= names, sorted(wanted - names)


def other_algorithms_gauges(algorithm: str) -> set[str]:
    """The series of built-in algorithms' gauges that a run of `algorithm` does not export."""
    from learner.algorithms import ALGORITHMS

    def series(name: str) -> set[str]:
        return {f"apprentice_{g.name}" for g in ALGORITHMS[name].gauges}

    return set().union(*map(series, ALGORITHMS)) - series(algorithm)


def stop_head(head: subprocess.Popen, gcs: int) -> None:
    """SIGTERM: most of the head's processes exit within a second, but its GCS server takes
    ~33 s (measured here), which `ray start --block` waits out; what is left after a few seconds
    is killed (nothing of the run is on the head any more)."""
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=60)
    # `ray start` recorded its head as this machine's current cluster, which `ray stop` would
    # have removed: left behind, a later bare `ray.init()` on the machine tries to join the
    # dead head. Only the record naming this test's head is removed.
    from ray._common.utils import get_ray_address_file

    current = Path(get_ray_address_file(None))
    if current.is_file() and current.read_text().strip() == f"127.0.0.1:{gcs}":
        current.unlink()


def resume_on_an_embedded_node(run_dir: Path, warm: int) -> None:
    """`--resume` of the submitted run, 2 more steps with its report: totals continue and the
    W&B run too. On the HF engine (`--allow-change`): the submitted run was vLLM's, and an
    engine core costs ~20 s of the two cores for what the resume does not test. With the rate's
    cosine ended by the wall clock (learner.schedule_end): the resumed steps' rates fall with
    the resumed run's clock, where its 100,000 steps alone would leave them at the peak."""
    final = warm + 4
    resumed = subprocess.run([sys.executable, "-m", "jobs.train", "--resume", str(run_dir), "--allow-change",
                              "rollout.engine,learner.schedule,learner.schedule_end,learner.total_steps",
                              "run.steps=6", *HF_ENGINE, "run.report=true", "learner.schedule=cosine",
                              "learner.schedule_end=wall_clock", "learner.total_steps=100000", "run.max_wall_s=280",
                              f"run.metrics_port={free_port()}"], cwd=ROOT, env=job_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_quiet_console(resumed.stdout + resumed.stderr, run_dir)
    assert "resumed from" in resumed.stdout and f"at version {final}" in resumed.stdout
    assert "warm start" not in resumed.stdout  # done once, before the first checkpoint
    assert f"step {final + 1:4d}" in resumed.stdout and f"step {warm + 1:4d} " not in resumed.stdout
    table = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["version"] for r in table] == list(range(warm + 1, warm + 7))
    # Totals continue across the resume (the resumed workers and buffer count from 0).
    assert all(a["episodes"] <= b["episodes"] and a["buffer_put"] <= b["buffer_put"] for a, b in zip(table, table[1:]))
    assert all(0 <= r["train_success_rate"] <= 1 for r in table if r["train_success_rate"] is not None)
    assert [r["num_past_samples"] for r in table] == [2] * 6  # the demonstrations made again on the resume
    # The submitted run's constant rate, then the cosine at the resumed run's clock: by steps
    # (5 and 6 of 100,000) it would be 1 - 1e-8 of the peak; seconds of a 280 s clock take more.
    peak, rates = table[0]["lr"], [r["lr"] for r in table]
    assert rates[:4] == [peak] * 4 and peak * (1 - 1e-6) > rates[4] > rates[5] > 0, rates
    # The job reports itself at its end: every figure, the table with the warm start's eval, and
    # a summary naming them as its last lines.
    assert all((run_dir / f"{name}.png").stat().st_size > 5000 for name in FIGURES)
    last = [line for line in resumed.stdout.splitlines() if not line.startswith(("(", "\x1b["))][-4:]  # no actor logs
    assert last[0].startswith(f"run ended at version {warm + 6} (6 learner steps recorded, after {warm} warm-start")
    assert last[1].startswith("eval ") and last[2] == f"report {run_dir / 'report.md'} and its figures"
    assert json.loads(last[3]) == {"final_version": warm + 6, "run_dir": str(run_dir)}
    # W&B (offline): the resumed job continued the first job's run.
    run_id = (run_dir / "wandb_run_id").read_text()
    offline = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(offline) == 2 and all(path.stat().st_size > 0 for path in offline)
    assert f"| run | {warm + 1}-{warm + 6} |" in (run_dir / "report.md").read_text()


def test_a_short_tcod_b2f_run_records_the_horizon_and_per_turn_kl_and_replays_past_batches(tmp_path):
    experts = tmp_path / "expert"
    collected = subprocess.run([sys.executable, "-m", "jobs.collect_expert", "env.room_size=6", "env.num_distractors=0",
                                "env.task_types=[go_to, pick_up]", "max_turns=3", "num_tasks=400",
                                f"output_dir={experts}"], cwd=ROOT, env=job_env(), capture_output=True, text=True,
                               timeout=120)
    assert collected.returncode == 0 and (experts / "expert.parquet").is_file(), collected.stderr
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "jobs.train", *SHORT, f"run.dir={run_dir}", "run.steps=4",
                           "run.eval_every=0", f"run.metrics_port={free_port()}", "learner.algorithm.name=tcod",
                           "learner.algorithm.tcod.mode=b2f", f"learner.algorithm.tcod.expert_path={experts}",
                           "learner.algorithm.opd_scale=0", "aggregate.num_replayed_samples=8", *HF_ENGINE],
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    # k = 1 + ⌊n / 2⌋ at main-loop version n, capped by the 3-turn limit.
    assert [(r["version"], dict(r["gauges"])["horizon_k"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 2.0), (4, 3.0)]
    assert all(r["reverse_kl_by_turn"] for r in rows) and any(r["format_error_rate_by_turn"] for r in rows)
    # The top-k term alone (DAgger's relabelling) trains past batches again: 8 of them from the second step on.
    assert [r["num_past_samples"] for r in rows] == [0, 8, 8, 8]


def build_teacher(teacher_dir: Path) -> list[str]:
    """jobs.build_teacher: the nano student's model with c+ (skill bank and map), a short warm start
    and two GRPO steps (groups that all fail still train: the nano model fails them all), an
    evaluation after each (run.export_best keeps the best). Returns the teacher's overrides, as
    built but for the map (the test's refusal)."""
    built = subprocess.run([sys.executable, "-m", "jobs.build_teacher", "--config", "jobs/configs/babyai_teacher_tiny.yaml",
                            "model.path=tiny:nano", f"run.dir={teacher_dir}", "run.steps=2", "run.eval_every=1",
                            "run.eval_tasks=4", "run.metrics_port=null", "rollout.loop.max_turns=3",
                            "buffer.batch_size=16", "warm_start.num_episodes=16", "warm_start.epochs=1",
                            "warm_start.batch_episodes=8", "learner.algorithm.drop_zero_variance_groups=false",
                            "rollout.engine=hf"],
                           cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    manifest = json.loads((teacher_dir / "hf" / "teacher.json").read_text())
    assert manifest["map"] and manifest["skills"] and 0.0 <= manifest["teacher_success"] <= 1.0
    assert manifest["eval_tasks"] == 4 and f"teacher written to {teacher_dir / 'hf'}" in built.stdout
    # The teacher is the better of the final policy (version warm + 2) and the best evaluation's.
    best = json.loads((teacher_dir / "best.json").read_text())
    final = int(re.search(r'"final_version": (\d+)', built.stdout).group(1))
    assert (teacher_dir / "best_hf" / "config.json").is_file() and best["version"] <= final
    if "is below version" in built.stdout:  # an earlier policy beat the final one
        assert (manifest["version"], manifest["teacher_success"]) == (best["version"], best["eval_success"])
    else:
        assert manifest["version"] == final and manifest["teacher_success"] >= best["eval_success"]
    return ["teacher.backend=hf", f"teacher.model.path={teacher_dir / 'hf'}",
            "teacher.privileged.skill_bank=envs/babyai_text/skills.yaml"]


def test_a_built_teacher_serves_retire_opd_which_frees_it_and_resume_keeps_it_retired(tmp_path):
    teacher = build_teacher(tmp_path / "teacher")
    # A teacher served without the context it was built with is refused before any actor starts.
    wrong = subprocess.run([sys.executable, "-m", "jobs.train", *SHORT, *teacher, "learner.algorithm.name=retire_opd",
                            f"run.dir={tmp_path / 'wrong'}", "run.metrics_port=null"],
                           cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "teacher.privileged.map (built: True; this job: False)" in wrong.stderr, wrong.stderr
    assert "ray namespace" not in wrong.stdout
    teacher.append("teacher.privileged.map=true")
    run_dir = tmp_path / "run"
    # Windows of one evaluation, γ = 0 and δ far below any gap change: the rule fires at the
    # second evaluation (m = 2), version 2.
    # Groups whose episodes all fail still train (OPD term): the untrained nano student fails them all.
    # The teacher's bundle holds CPUs here, so retirement starts a rollout worker in it.
    retire = ["cluster.plan.rollout.cpus=0.75", "cluster.plan.teacher.cpus=0.25",
              "learner.algorithm.name=retire_opd", "learner.algorithm.drop_zero_variance_groups=false",
              "learner.algorithm.retirement.window=1",
              "learner.algorithm.retirement.gamma=0", "learner.algorithm.retirement.delta=-1000000",
              "run.eval_every=1"]
    proc = subprocess.run([sys.executable, "-m", "jobs.train", *SHORT, *HF_ENGINE, *retire, *teacher,
                           f"run.dir={run_dir}", "run.steps=4", f"run.metrics_port={free_port()}"], cwd=ROOT,
                          env=job_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # SR_T is the built teacher's, read from teacher.json (not measured again).
    assert "teacher success (SR_T)" not in proc.stderr
    assert "teacher stopped by the retire_opd schedule at version 2: 1 teacher service(s) stopped, 1 rollout worker(s)" \
        in proc.stdout
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["teacher_stopped"] for r in rows] == [False, False, True, True]
    assert dict(rows[-1]["gauges"])["opd_lambda"] == 0.0 and rows[-1]["num_rollout_workers"] == 2
    resumed = subprocess.run([sys.executable, "-m", "jobs.train", "--resume", str(run_dir), "run.steps=6",
                              f"run.metrics_port={free_port()}"], cwd=ROOT, env=job_env(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "the retire_opd schedule had stopped the teacher: no teacher service started" in resumed.stdout
    assert "teacher stopped by" not in resumed.stdout
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["version"] for r in rows] == list(range(1, 7)) and rows[-1]["teacher_stopped"]
    assert rows[-1]["num_rollout_workers"] == 2


def test_a_short_turn_judge_run_serves_its_judge_and_trains_on_judged_turns(tmp_path):
    """The config's oracle judge swapped for a judge model the job serves itself (`judge.serve`:
    vllm serve of the nano model on 127.0.0.1 in the judge's actor), stopped with the job."""
    run_dir, log = tmp_path / "run", tmp_path / "job.log"
    with log.open("w") as out:
        job = subprocess.Popen([sys.executable, "-m", "jobs.train", "--config", "jobs/configs/babyai_turn_judge_tiny.yaml",
                                "model.path=tiny:nano", "buffer.batch_size=8", "rollout.loop.max_turns=3",
                                "rollout.sampling.max_new_tokens=16", "warm_start.num_episodes=0", "run.eval_every=0",
                                "run.steps=2", f"run.dir={run_dir}", f"run.metrics_port={free_port()}",
                                "judge.backend=http", "judge.serve.model.path=tiny:nano",
                                "judge.serve.max_model_len=4096", "judge.http.max_tokens=16",
                                "judge.http.max_retries=0", *HF_ENGINE],
                               cwd=ROOT, env=job_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
        served, deadline = {}, time.monotonic() + 600
        while job.poll() is None and time.monotonic() < deadline:
            served |= vllm_descendants(job.pid)
            time.sleep(0.5)
    if job.poll() is None:
        job.kill()
    assert job.wait() == 0, log.read_text()
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    # Every selected turn is judged once (scored, or neutral when the nano judge's answer has no
    # score tag); the counts only grow.
    assert 0 < rows[0]["judged_turns"] <= rows[1]["judged_turns"]
    assert 0 <= rows[-1]["judge_neutral_turns"] <= rows[-1]["judged_turns"]
    assert all(r["num_loss_tokens"] > 0 for r in rows)
    # The server and its engine core die with the judge's actor (cluster/reaper.py; the engine
    # core and its worker used to stay under init).
    assert {API_SERVER, "VLLM::EngineCore"} <= set(served.values()), served
    assert_all_exit(served)


def test_a_short_working_memory_run_trains_both_stages(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--config", "jobs/configs/babyai_memory_tiny.yaml",
                           "model.path=tiny:nano", "buffer.batch_size=8", "rollout.loop.max_turns=3",
                           "rollout.sampling.max_new_tokens=16", "rollout.loop.memory_max_new_tokens=8",
                           "warm_start.num_episodes=4", "warm_start.batch_episodes=2", "run.eval_every=2",
                           "learner.algorithm.drop_zero_variance_groups=false",
                           "run.eval_tasks=4", "run.steps=2", f"run.dir={run_dir}", f"run.metrics_port={free_port()}",
                           *HF_ENGINE],
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    # Every environment step of every finished episode had a memory response before its action.
    assert all(r["memory_turns"] > 0 and r["memory_turns"] == r["turns"] for r in rows)
    assert rows[0]["memory_format_error_rate"] is not None and all(r["num_loss_tokens"] > 0 for r in rows)
    assert rows[-1]["eval_success"] is not None
