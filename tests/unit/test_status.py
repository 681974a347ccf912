"""jobs.status on synthetic run directories: running, finished, stopped, not started, not a run."""

import json

from jobs.config import dump_config, load_config
from jobs.status import main, status_lines
from jobs.train import JobConfig
from test_report import synthetic_run


def run_dir(tmp_path, num_steps: int, planned: int, summary: bool):
    directory = tmp_path / "run"
    synthetic_run(directory, num_steps=num_steps, warm_steps=4, seed=0)  # versions 5..4+num_steps, time 1000+i
    config = load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", [f"run.steps={planned}"])
    (directory / "config.yaml").write_text(dump_config(config))
    if summary:
        (directory / "summary.json").write_text(json.dumps({"version": 4 + num_steps, "steps": num_steps}))
    return directory


def test_a_running_run_shows_its_version_eval_and_eta(tmp_path):
    lines = status_lines(run_dir(tmp_path, num_steps=6, planned=10, summary=False), now=1000.0 + 5 + 12)
    text = "\n".join(lines)
    assert "state      running (last step 12 s ago)" in text
    assert "version    10 of 14 (6 learner steps recorded, 4 warm-start SFT steps before)" in text
    assert "opd on babyai_text, model tiny:tiny" in lines[0]
    assert text.count("eval       ") == 1 and " at version 10 (best " in text and "go_to " in text
    assert "dropped stale 10 of 200 samples put (5%)" in text
    assert "eta        4 steps x 3.0 s = 0.2 min" in text


def test_finished_stopped_and_silent_runs(tmp_path):
    finished = status_lines(run_dir(tmp_path / "a", num_steps=6, planned=6, summary=True), now=5000.0)
    assert "state      finished" in finished and not any(line.startswith("eta") for line in finished)
    stopped = "\n".join(status_lines(run_dir(tmp_path / "b", num_steps=6, planned=10, summary=True), now=5000.0))
    assert "state      stopped at version 10 (continue with: python -m jobs.train --resume RUN_DIR)" in stopped
    silent = "\n".join(status_lines(run_dir(tmp_path / "c", num_steps=6, planned=10, summary=False), now=5000.0))
    assert "running or died: no step for 67 min and no summary.json" in silent


def test_a_directory_without_a_run_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert f"jobs.status: {tmp_path} is not a run directory: it has no config.yaml" in capsys.readouterr().err
    directory = run_dir(tmp_path, num_steps=1, planned=3, summary=False)
    (directory / "metrics.parquet").unlink()
    assert status_lines(directory)[1] == "state      started, no learner step yet (warm start or start-up)"
    assert main([]) == 2


def test_a_live_job_from_its_metrics_endpoint(capsys):
    from cluster.local import free_port
    from cluster.metrics import MetricsExporter
    from jobs.status import live_status_lines

    port = free_port()
    exporter = MetricsExporter("127.0.0.1", port)
    try:
        exporter.set("learner_version", 12)
        exporter.set("eval_success", 0.5, task_type="overall")
        exporter.set("eval_success", 0.75, task_type="go_to")
        exporter.set("rollout_tokens_per_s", 640)
        exporter.observe("consumed_staleness", 1, count=3)
        exporter.observe("consumed_staleness", 2, count=1)
        exporter.inc("buffer_dropped", 7, reason="stale")
        exporter.inc("actor_restarts", 1, component="teacher")
        lines = live_status_lines(f"127.0.0.1:{port}")
        assert main(["--address", f"http://127.0.0.1:{port}/metrics"]) == 0
    finally:
        exporter.close()
    assert lines[1] == "version    12" and lines[2] == "eval       0.500; go_to 0.75"
    assert "640 rollout tokens/s" in lines[4]
    assert lines[5].startswith("staleness  mean 1.25 over 4 samples consumed") and "dropped: stale 7" in lines[5]
    assert lines[6].startswith("restarts   teacher 1")
    assert capsys.readouterr().out.splitlines()[1] == "version    12"
    # the job is gone: the same address no longer answers
    assert main(["--address", f"127.0.0.1:{port}"]) == 2
    assert "is the job running, with run.metrics_port set?" in capsys.readouterr().err
