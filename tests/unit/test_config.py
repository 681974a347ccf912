import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.config import ConfigError, apply_override, load_config
from jobs.evaluate import EvaluateConfig


def test_overrides_nest_and_parse_yaml():
    data = {}
    apply_override(data, "loop.max_turns=7")
    apply_override(data, "env.task_types=[go_to, open]")
    apply_override(data, "num_tasks=null")
    assert data == {"loop": {"max_turns": 7}, "env": {"task_types": ["go_to", "open"]}, "num_tasks": None}


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("split: eval\nnum_tasks: 4\nloop:\n  max_turns: 3\n")
    cfg = load_config(EvaluateConfig, path, ["loop.max_turns=5"])
    assert (cfg.split, cfg.num_tasks, cfg.loop.max_turns) == ("eval", 4, 5)
    assert [(t.split, t.seed) for t in cfg.tasks()] == [("eval", 0), ("eval", 1), ("eval", 2), ("eval", 3)]


@pytest.mark.parametrize("overrides, message", [
    (["loop.bogus=1"], "unknown key 'loop.bogus'"),
    (["loop.max_turns=0"], "loop.max_turns"),
    (["env.task_types=[fly]"], "unknown task type"),
    (["split=eval"], "unbounded: set num_tasks"),
    (["split=nope"], "split must be one of"),
    (["num_tasks=51"], "has 50 tasks"),
    (["model.dtype=int8"], "model.dtype"),
    (["no_equals_sign"], "key.sub=value"),
])
def test_bad_configs_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(EvaluateConfig, None, overrides)


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(EvaluateConfig, tmp_path / "none.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(EvaluateConfig, bad)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.loop.max_context_tokens=4096"], r"max_context_tokens \(4096\) must be <= rollout.vllm.max_model_len"),
    (["teacher.backend=vllm", "teacher.vllm.max_model_len=512"],
     r"max_context_tokens \(\d+\) must be <= teacher.vllm.max_model_len \(512\)"),
    (["env.room_size=2"], "env.room_size"),
    (["rollout.loop.prompt.tools=json"], "rollout.loop.prompt.tools"),
    (["learner.algorithm.opd_advantage_clip=-1"], "learner.algorithm.opd_advantage_clip"),
    (["run.max_wall_s=0"], "run.max_wall_s"),
    (["run.steps=0", "warm_start.num_episodes=0"], "run.steps=0 trains the warm start alone, and there is none"),
    (["rollout.segments=true", "learner.algorithm.name=joint"], "rollout.segments needs an algorithm without"),
    (["rollout.num_envs=2"], r"rollout.num_envs \(2\) must hold one group \(rollout.group_size=4\)"),
    (["learner.algorithm={name: grpo_window}", "teacher=null"], "set rollout.group_size=1, got 4"),
    (["run.publish_every=4"], r"run.publish_every=4 .* buffer.max_staleness=2"),
    (["buffer.weights_lag=3"], r"buffer.weights_lag=3 exceeds buffer.max_staleness=2"),
])
def test_bad_job_configs_name_the_key(overrides, message):
    from jobs.train import JobConfig

    with pytest.raises(ConfigError, match=message):
        load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", overrides)


def test_an_algorithm_section_holds_the_shared_knobs_and_its_own_only():
    """Each algorithm validates its section as its own config class: another algorithm's knob,
    left by switching `name` alone, is an error naming whose knob it is and how to switch; the
    whole section replaced switches; the subclass's knobs survive the dump a resume reads back."""
    from jobs.train import JobConfig
    from learner.algorithms import AlgorithmConfig, RetireOPDConfig, TCODAlgorithmConfig, switch_algorithm

    retire = "jobs/configs/babyai_retire_tiny.yaml"
    # (an algorithm a test registered, e.g. tests/e2e/test_plugin_job.py's, may own the knob too)
    with pytest.raises(ConfigError, match=r"name=grpo has no opd_lambda \(a knob of ([\w]+, )*joint, retire_opd\), "
                                          r"retirement \(a knob of retire_opd\); to switch algorithms, give the whole"):
        load_config(JobConfig, retire, ["learner.algorithm.name=grpo", "teacher=null"])
    switched = load_config(JobConfig, retire, ["learner.algorithm={name: grpo}", "teacher=null"])
    assert type(switched.learner.algorithm) is AlgorithmConfig and switched.learner.algorithm.name == "grpo"
    config = load_config(JobConfig, retire, ["learner.algorithm.retirement.window=3"])
    assert isinstance(config.learner.algorithm, RetireOPDConfig) and config.learner.algorithm.retirement.window == 3
    assert JobConfig.model_validate(config.model_dump(mode="json")) == config
    with pytest.raises(ValueError, match="configured by TCODAlgorithmConfig"):
        AlgorithmConfig(name="tcod")
    tcod = load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml",
                       ["learner.algorithm.name=tcod", "learner.algorithm.tcod.mode=f2b"]).learner.algorithm
    assert isinstance(tcod, TCODAlgorithmConfig) and tcod.opd_advantage_clip == 3.0
    never = switch_algorithm(config.learner.algorithm, "joint", topk_kl_coef=0.0)
    assert (never.name, never.opd_lambda, never.opd_advantage_clip, never.topk_kl_coef) == ("joint", 0.1, 3.0, 0.0)
    assert not hasattr(never, "retirement")


def test_shipped_job_configs_validate():
    from pathlib import Path

    from jobs.train import JobConfig

    for path in sorted(Path("jobs/configs").glob("*.yaml")) + sorted(Path("jobs/configs/recipes").glob("*.yaml")):
        load_config(JobConfig, path)


def _leaf_keys(node, prefix=""):
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, path + ".")
        else:
            yield path


@functools.cache
def _job_keys():
    from jobs.train import JobConfig

    return sorted(_leaf_keys(load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml").model_dump(mode="json")))


_values = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["null", "true", "[]", "{}", "[1, [2]]", "{a: 1}", "'x'", "-1", "0", "1e309", "nan",
                     "[unclosed", "{a: [", "key: : value", "\tbad", "*alias", "!!python/object:os.system x"]),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_overrides_fail_as_config_errors_naming_the_key(data):
    """Any override of any key (a real one, a misspelt one, a new one) with any value either
    validates or raises ConfigError whose message names the key's section: never another error."""
    from jobs.train import JobConfig

    keys = _job_keys()
    key = data.draw(st.one_of(st.sampled_from(keys), st.sampled_from(keys).map(lambda k: k + "x"),
                              st.sampled_from(keys).map(lambda k: k.rsplit(".", 1)[0] + ".nope")))
    value = data.draw(_values)
    try:
        load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", [f"{key}={value}"])
    except ConfigError as exc:
        assert key.split(".")[0] in str(exc), (key, value, str(exc))


def test_the_plan_reserves_a_judge_bundle_only_for_a_judge_that_serves_its_model():
    from cluster.plan import ResourcePlan
    from jobs.train import JobConfig

    plan = ResourcePlan(preset="custom", judge={"count": 1, "cpus": 2, "gpus": 1})
    assert plan.bundles()[-1] == {"CPU": 2, "GPU": 1} and "judge    1 x (2 CPU, 1 GPU)" in plan.describe()
    assert "judge" not in ResourcePlan().describe() and ResourcePlan().needs()["GPU"] == 0
    with pytest.raises(ValueError, match="0 or 1"):
        ResourcePlan(judge={"count": 2, "cpus": 1})
    with pytest.raises(ConfigError, match="set judge.serve"):
        load_config(JobConfig, "jobs/configs/babyai_turn_judge_tiny.yaml", ["cluster.plan.judge.count=1",
                                                                            "cluster.plan.judge.cpus=1"])
    with pytest.raises(ConfigError, match="the oracle backend cannot judge through one"):
        load_config(JobConfig, "jobs/configs/babyai_turn_judge_tiny.yaml", ["judge.serve.model.path=tiny:nano"])


def test_environment_actors_are_reserved_in_the_plan_one_bundle_each():
    from cluster.plan import ResourcePlan
    from jobs.train import JobConfig

    config = load_config(JobConfig, "jobs/configs/alfworld_grpo_tiny.yaml", [])
    plan = config.cluster.plan
    assert plan.bundles()[-16:] == [{"CPU": 0.03125}] * 16 and plan.needs()["CPU"] == 2.0
    assert "env      16 x (0.03125 CPU, 0 GPU)" in plan.describe() and "env" not in ResourcePlan().describe()
    with pytest.raises(ConfigError, match=r"cluster.plan.env.count must be 8 \(rollout workers 1 x rollout.num_envs 4"):
        load_config(JobConfig, "jobs/configs/alfworld_grpo_tiny.yaml", ["rollout.num_envs=4"])
    assert load_config(JobConfig, "jobs/configs/alfworld_grpo_tiny.yaml",
                       ["cluster.plan.env.count=0"]).cluster.plan.bundles() == [{"CPU": 0.5}, {"CPU": 1.0}]
    with pytest.raises(ConfigError, match="rollout.env_actors is false"):
        load_config(JobConfig, "jobs/configs/alfworld_grpo_tiny.yaml", ["rollout.env_actors=false"])


def test_a_role_given_in_part_keeps_the_presets_other_keys():
    from cluster.plan import ResourcePlan

    plan = ResourcePlan(preset="gpu-8", rollout={"cpus": 4})
    assert (plan.rollout.count, plan.rollout.cpus, plan.rollout.gpus) == (4, 4.0, 1.0)
    assert ResourcePlan(preset="cpu", teacher={"cpus": 0.25}).teacher.count == 1


def test_a_spread_learner_gets_a_strict_spread_group_reserved_first():
    from cluster.plan import ResourcePlan

    plan = ResourcePlan(preset="gpu-8", spread_learner=True)
    assert plan.groups() == [("STRICT_SPREAD", ("learner",)), ("PACK", ("rollout", "teacher", "judge", "env"))]
    assert plan.bundles(("learner",)) == [{"CPU": 2.0, "GPU": 1.0}] * 2 and len(plan.bundles(plan.groups()[1][1])) == 6
    assert ResourcePlan(preset="gpu-8").groups() == [("PACK", ("rollout", "teacher", "learner", "judge", "env"))]


GPU_PRESETS = sorted(str(p) for p in [*__import__("pathlib").Path("jobs/configs").glob("*_gpu8.yaml"),
                                      *__import__("pathlib").Path("jobs/configs/recipes").glob("*.yaml")])
"""The 8-GPU presets and the documents' recipes (jobs/configs/recipes/)."""


@pytest.mark.parametrize("path", GPU_PRESETS)
def test_a_miniature_keeps_the_presets_structure_at_cpu_size(path):
    from jobs.miniature import miniature
    from jobs.train import JobConfig

    full = load_config(JobConfig, path)
    for gpus in ("cpu", "gpus"):
        mini = load_config(JobConfig, path, ["run.steps=3"],
                           transform=lambda data: miniature(data, num_cpus=2, gpus=gpus))
        assert mini.run.steps == 3  # the command line wins over the miniature
        for role in ("rollout", "teacher", "learner", "judge", "env"):
            before, after = getattr(full.cluster.plan, role), getattr(mini.cluster.plan, role)
            # Environment actors follow the miniature's smaller num_envs (two sets per worker).
            count = mini.cluster.plan.rollout.count * mini.rollout.num_envs * 2 if role == "env" and before.count \
                else before.count
            assert after.count == count and after.reserves == before.reserves, role
            assert after.gpus == (before.gpus if gpus == "gpus" else 0.0), role
        assert mini.cluster.plan.needs()["CPU"] <= 2 * 0.9 + 1e-9
        assert mini.model.path == "tiny:nano" and mini.model.dtype == full.model.dtype == "bfloat16"
        assert mini.rollout.engine == full.rollout.engine and mini.rollout.vllm.dtype == full.rollout.vllm.dtype
        assert mini.rollout.group_size == full.rollout.group_size and mini.rollout.num_envs >= mini.rollout.group_size
        assert mini.learner.algorithm.name == full.learner.algorithm.name
        if full.learner.algorithm.name == "retire_opd":  # its tiny model teacher's SR_T is not known
            assert mini.learner.algorithm.retirement.teacher_success == 1.0
        assert mini.buffer.max_staleness == full.buffer.max_staleness
        assert (mini.teacher is None) == (full.teacher is None) and (mini.judge is None) == (full.judge is None)
        if full.teacher is not None:
            assert mini.teacher.backend == full.teacher.backend and mini.teacher.top_k == full.teacher.top_k
            if full.teacher.backend == "vllm":
                assert mini.teacher.model.path == "tiny:tiny" and mini.teacher.vllm.dtype == full.teacher.vllm.dtype
        assert mini.env == full.env and mini.run.dir == full.run.dir + "-miniature"


def _run_dir_with(tmp_path, *overrides):
    """A run directory as a finished run leaves it: config.yaml and a checkpoint that verifies."""
    import json

    import torch
    import torch.distributed.checkpoint as dcp

    from jobs.config import dump_config
    from jobs.train import JobConfig

    run_dir = tmp_path / "run"
    config = load_config(JobConfig, None, [f"run.dir={run_dir}", *overrides])
    checkpoint = run_dir / "checkpoints" / "step_000004"
    dcp.save({"model": {"w": torch.zeros(2)}}, checkpoint_id=str(checkpoint / "dcp"), no_dist=True)
    torch.save({"torch": torch.get_rng_state()}, checkpoint / "rng_rank0.pt")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"version": 4, "world_size": 1, "extra": {}}))
    (run_dir / "checkpoints" / "latest").write_text("step_000004")
    (run_dir / "config.yaml").write_text(dump_config(config))
    return run_dir


def test_admission_expects_the_turn_limit_per_episode_unless_told_otherwise():
    from jobs.train import JobConfig

    path = "jobs/configs/babyai_opd_tiny.yaml"
    assert load_config(JobConfig, path, []).buffer.samples_per_episode_prior == 10
    assert load_config(JobConfig, path, ["rollout.loop.max_turns=7"]).buffer.samples_per_episode_prior == 7
    given = load_config(JobConfig, path, ["buffer.samples_per_episode_prior=3", "rollout.loop.max_turns=7"])
    assert given.buffer.samples_per_episode_prior == 3
    assert JobConfig().buffer.samples_per_episode_prior == JobConfig().rollout.loop.max_turns
    # The weights a sample starts from lag by up to a round of published versions.
    assert load_config(JobConfig, path, []).buffer.weights_lag == 0
    rounds = ["run.publish_every=3", "buffer.max_staleness=4"]
    assert load_config(JobConfig, path, rounds).buffer.weights_lag == 2
    assert load_config(JobConfig, path, [*rounds, "buffer.weights_lag=1"]).buffer.weights_lag == 1


def test_resume_refuses_a_changed_config_unless_the_keys_are_named(tmp_path):
    from jobs.train import JobConfig, check_run_dir

    run_dir = _run_dir_with(tmp_path, "learner.lr=0.001")
    same = load_config(JobConfig, run_dir / "config.yaml", ["run.steps=50", "run.metrics_port=9999"])
    assert check_run_dir(same, resume=True) == {"run.metrics_port": (9400, 9999), "run.steps": (30, 50)}
    changed = load_config(JobConfig, run_dir / "config.yaml", ["learner.lr=0.01", "rollout.group_size=8"])
    with pytest.raises(ValueError, match=r"learner.lr: 0.001 -> 0.01; rollout.group_size: 4 -> 8.*"
                                         r"--allow-change learner.lr,rollout.group_size"):
        check_run_dir(changed, resume=True)
    with pytest.raises(ValueError, match="rollout.group_size: 4 -> 8"):
        check_run_dir(changed, resume=True, allow_change=("learner.lr",))
    assert set(check_run_dir(changed, resume=True, allow_change=("learner.", "rollout.group_size"))) == \
        {"learner.lr", "rollout.group_size"}


def test_resume_refuses_a_damaged_metrics_file_and_a_fresh_run_a_used_directory(tmp_path):
    from jobs.train import JobConfig, check_run_dir, remove_run_outputs, used_run_dir

    run_dir = _run_dir_with(tmp_path)
    config = load_config(JobConfig, run_dir / "config.yaml")
    (run_dir / "metrics.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(ValueError, match="metrics.parquet is damaged and cannot be read.*move it away"):
        check_run_dir(config, resume=True)
    with pytest.raises(ValueError, match=r"holds another run \(config.yaml, checkpoints, metrics.parquet\): "
                                         r"continue it with --resume .*--overwrite to start over"):
        check_run_dir(config, resume=False)
    assert check_run_dir(config, resume=False, overwrite=True) == {}
    (run_dir / "eval_start").mkdir()  # a benchmark's own output beside the run's
    remove_run_outputs(run_dir)  # what --overwrite does once every check passed
    assert used_run_dir(run_dir) == [] and sorted(p.name for p in run_dir.iterdir()) == ["eval_start"]
    assert check_run_dir(config.model_copy(update={"run": config.run.model_copy(update={"dir": str(tmp_path / "new")})}),
                         resume=False) == {}


def test_joining_a_cluster_leaves_rays_auth_as_the_user_set_it(monkeypatch):
    import logging
    import os

    import ray

    from jobs.train import ClusterConfig, connect

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    seen = {}
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs, auth=os.environ.get("RAY_AUTH_MODE")))
    connect(ClusterConfig(address="10.0.0.5:6379"), "apprentice-x", log_level="error")
    assert seen == {"address": "10.0.0.5:6379", "namespace": "apprentice-x", "logging_level": logging.WARNING,
                    "auth": None}


@pytest.mark.parametrize("second_signal", [True, False], ids=["second-signal", "stop-timeout"])
def test_a_stop_that_does_not_end_is_cut_short_by_a_second_signal_or_the_stop_timeout(second_signal):
    # A driver blocked in a call that never returns (a hung step, a teardown): the first SIGTERM
    # only asks for a stop; a second one, or run.stop_timeout_s later, ends the process.
    import signal
    import subprocess
    import sys
    import time

    code = ("from jobs.train import StopSignals; import time; StopSignals(stop_timeout_s=3.0); "
            "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    if second_signal:
        time.sleep(0.5)
        assert proc.poll() is None  # the first only asked for a stop
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - start < (2.5 if second_signal else 10)
    assert ("again: exiting now" if second_signal else "3 s ago: exiting now") in out


def test_a_dry_run_runs_every_check_a_start_makes_and_says_which_it_could_not(capsys, tmp_path):
    # The inputs that a schema-only dry run let through: each is named, and the checks
    # that need the missing model are said not run; nothing starts (no Ray here).
    from jobs.train import main

    status = main(["--dry-run", "--verbose", f"run.dir={tmp_path / 'run'}", "model.path=/nonexistent", "run.eval_split=nosplit",
                   "teacher.backend=remote", "teacher.remote.url=http://127.0.0.1:9/v1",
                   "cluster.plan.rollout={count: 3, cpus: 1}"])
    out = capsys.readouterr().out
    assert status == 2 and "dry run: 3 check(s) failed" in out
    assert "  log_level: info\n" in out  # --verbose
    assert "FAILED   model /nonexistent: model.path '/nonexistent' is not a local model directory" in out
    assert "FAILED   run.eval_split: environment 'babyai_text' has no split 'nosplit'" in out
    assert "FAILED   cluster: the resource plan does not fit the cluster (CPU: need 4, have 2) on the embedded node" in out
    assert "not run  teacher (remote): needs the student's tokenizer" in out
    status = main(["--dry-run", f"run.dir={tmp_path / 'run'}", "teacher.backend=remote",
                   "teacher.remote.url=http://127.0.0.1:9/v1"])
    out = capsys.readouterr().out
    assert status == 2 and "FAILED   teacher (remote): teacher.remote.url http://127.0.0.1:9/v1" in out and "the server does not answer" in out


@pytest.mark.parametrize("path", ["jobs/configs/babyai_opd_qwen3_gpu8.yaml", "jobs/configs/babyai_opd_remote_qwen3_gpu8.yaml",
                                  "jobs/configs/babyai_turn_judge_qwen3_gpu8.yaml",
                                  "jobs/configs/scienceworld_tcod_qwen3_gpu8.yaml",
                                  *sorted(str(p) for p in __import__("pathlib").Path("jobs/configs/recipes").glob("*.yaml"))])
def test_a_gpu8_preset_dry_run_on_this_machine_fails_only_for_its_models_and_gpus(capsys, path, tmp_path, request,
                                                                                 monkeypatch):
    """Its models are absent here (/models/..., or a run directory an earlier recipe step builds, and
    B2F's τ* that a collect_expert step writes), and so are 8 GPUs; nothing else fails."""
    from jobs.train import main

    if "alfworld" in path:  # the test games: valid_train stands in for the train split they lack
        games = request.getfixturevalue("alfworld_data")
        layout = tmp_path / "alfworld"
        (layout / "json_2.1.1").mkdir(parents=True)
        (layout / "logic").symlink_to(games / "logic")
        for split in ("valid_seen", "valid_unseen", "valid_train"):
            (layout / "json_2.1.1" / split).symlink_to(games / "json_2.1.1" / split)
        (layout / "json_2.1.1" / "train").symlink_to(games / "json_2.1.1" / "valid_train")
        monkeypatch.setenv("ALFWORLD_DATA", str(layout))
    # (the metrics port is another test's: a job running on this machine holds 9400)
    status = main(["--config", path, "--dry-run", f"run.dir={tmp_path / 'run'}", "run.metrics_port=null"])
    out = capsys.readouterr().out
    failed = [line.strip() for line in out.splitlines() if line.strip().startswith("FAILED")]
    assert status == 2 and "total    " in out and ", 8 GPU" in out
    assert failed[-1].startswith("FAILED   cluster: the resource plan does not fit the cluster") and "GPU: need 8" in failed[-1]
    built = ("FAILED   model runs/recipe_", "FAILED   curriculum: ",
             "FAILED   learner.algorithm schedule: model.path 'runs/recipe_") if "/recipes/" in path else ()
    assert all(line.startswith(("FAILED   model /models/", *built)) for line in failed[:-1]), failed


def test_the_start_banner_says_what_runs_and_where_to_watch_it():
    from jobs.train import JobConfig, banner

    config = load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", [])
    lines = banner(config, "apprentice-babyai_opd_tiny").splitlines()
    assert lines[0] == ("apprentice: opd on babyai_text (train), model tiny:tiny, teacher oracle; 30 steps after a "
                        "256-episode warm start")
    assert lines[1] == ("run dir runs/babyai_opd_tiny; metrics http://127.0.0.1:9400/metrics; status: "
                        "python -m jobs.status runs/babyai_opd_tiny")
    assert lines[2].startswith("ray namespace apprentice-babyai_opd_tiny: actors buffer")
    assert banner(config, "ns", resume=True).splitlines()[0].endswith("30 steps in all, resumed from its newest checkpoint")
    quiet = load_config(JobConfig, "jobs/configs/babyai_grpo_tiny.yaml", ["run.metrics_port=null"])
    assert "teacher none" in banner(quiet, "ns") and "metrics off" in banner(quiet, "ns")
    assert banner(quiet, "ns", dashboard="127.0.0.1:8265").endswith("; dashboard http://127.0.0.1:8265")


def test_target_eval_success_ends_the_run_at_the_first_evaluation_that_reaches_it(capsys):
    from types import SimpleNamespace

    from jobs.train import JobConfig
    from jobs.training import TrainingRun

    run = SimpleNamespace(config=load_config(JobConfig, None, ["run.target_eval_success=0.6"]), target_reached=False)
    TrainingRun._evaluated(run, 0.59, {})
    assert not run.target_reached
    TrainingRun._evaluated(run, 0.6, {})
    assert run.target_reached and "reached run.target_eval_success=0.6" in capsys.readouterr().out
    never = SimpleNamespace(config=load_config(JobConfig, None, []), target_reached=False)
    TrainingRun._evaluated(never, 1.0, {})
    assert not never.target_reached
    with pytest.raises(ConfigError, match="target_eval_success"):
        load_config(JobConfig, None, ["run.target_eval_success=1.5"])


def test_export_best_keeps_the_policy_of_the_best_evaluation_beside_the_final_one(tmp_path):
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from jobs.train import JobConfig
    from jobs.training import TrainingRun, read_best

    def export_hf(path):  # the learner's export: a directory naming the version it holds
        Path(path).mkdir()
        (Path(path) / "version").write_text(str(run.version))

    run = SimpleNamespace(config=load_config(JobConfig, None, ["run.export_best=true"]), target_reached=False,
                          dir=tmp_path, version=0, learner=SimpleNamespace(export_hf=export_hf))
    assert read_best(tmp_path)["eval_success"] == float("-inf")
    for version, success in [(4, 0.5), (5, 0.7), (6, 0.6), (7, 0.7)]:
        run.version = version
        TrainingRun._evaluated(run, success, {"go_to": success})
    # The first of the best (a tie keeps the earlier policy), swapped in whole.
    assert read_best(tmp_path) == {"version": 5, "eval_success": 0.7, "eval_success_by_type": {"go_to": 0.7}}
    assert (tmp_path / "best_hf" / "version").read_text() == "5" and not (tmp_path / "best_hf.tmp").exists()
    assert json.loads((tmp_path / "best.json").read_text())["version"] == 5
    off = SimpleNamespace(config=load_config(JobConfig, None, []), target_reached=False, dir=tmp_path / "off")
    TrainingRun._evaluated(off, 1.0, {})  # no export without the option (and no learner needed)


def test_releasing_placement_groups_waits_at_most_its_deadline():
    import threading
    import time

    from cluster.plan import release

    removed = []
    release(["g0", "g1"], timeout_s=5, remove=removed.append)
    assert removed == ["g0", "g1"]
    # A call that never returns (a close was seen blocked in Ray's; not reproduced): the close still returns.
    never = threading.Event()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not remove the run's 2 placement group"):
        release(["g0", "g1"], timeout_s=0.2, remove=lambda group: never.wait())
    assert time.monotonic() - start < 5
    never.set()
