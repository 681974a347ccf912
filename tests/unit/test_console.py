"""The console filter of the workers' output (jobs/console.py), on lines the quickstart printed."""

from __future__ import annotations

import pytest

from jobs.console import WorkerLogs, classify, filtered_worker_logs

# As Ray hands them to the driver (its "(RolloutWorker pid=...)" prefix is added when printed).
VLLM_WARNING = "(Worker pid=24440) WARNING 12-02 08:19:08 [layerwise.py:266] RotaryEmbedding: Failed to load weights"
ENGINE_WARNING = ("(EngineCore pid=24422) WARNING 12-02 08:15:51 [vllm.py:725] Model Runner V2 requires Triton; "
                  "using the V1 model runner instead.")
TORCH_WARNING = ("[W1202 08:15:49.380292319 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory "
                 "allocation on the NUMA nodes (0). (function init_cpu_memory_env)")
PY_WARNING = ("/work/main/.venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: "
              "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead")
PY_WARNING_SOURCE = '  if hasattr(value, "__dict__"):'
PROGRESS = "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]"
HF_PROGRESS = ("Loading weights:   0%|          | 0/46 [00:00<?, ?it/s]Loading weights: 100%|██████████| 46/46 "
               "[00:00<00:00, 23872.55it/s]")
TRITON = "Triton is installed, but doesn't include CPU backend. Disabling Triton."
OURS = ("worker-0: the teacher did not answer within 60 s: killed as hung; its groups are scored again by the "
        "restarted one")
TRACEBACK = ["Traceback (most recent call last):", '  File "actors/rollout_worker.py", line 12, in run',
             "    raise ValueError(x)", "ValueError: boom"]


@pytest.mark.parametrize("line, level", [
    (VLLM_WARNING, "warning"), (ENGINE_WARNING, "warning"), (TORCH_WARNING, "warning"), (PY_WARNING, "warning"),
    (PROGRESS, "info"), (HF_PROGRESS, "info"), (TRITON, "warning"),
    ("(EngineCore pid=1) INFO 12-02 08:15:51 [core.py:1] init engine", "info"),
    ("(EngineCore pid=1) ERROR 12-02 08:15:51 [core.py:1] EngineCore failed", "error"),
    ("[E1202 08:15:49.380 utils.cpp:68] something broke", "error"),
    (OURS, None), (TRACEBACK[0], None), ("ValueError: boom", None),
])
def test_a_line_is_third_party_at_its_level_or_ours(line, level):
    assert classify(line, None) == level


def test_indented_and_blank_lines_continue_the_line_before():
    assert classify(PY_WARNING_SOURCE, "warning") == "warning"
    assert classify("", "info") == "info"
    assert classify("   ", None) == "info"  # a stray blank line is hidden below info too
    # a traceback's frames are shown with it
    levels, previous = [], None
    for line in TRACEBACK:
        previous = classify(line, previous)
        levels.append(previous)
    assert levels == [None, None, None, None]


def batch(lines, pid=24286, is_err=False):
    return {"pid": pid, "is_err": is_err, "actor_name": "RolloutWorker(worker-0)", "lines": lines}


QUICKSTART = [ENGINE_WARNING, TORCH_WARNING, PY_WARNING, PY_WARNING_SOURCE, PROGRESS, "", VLLM_WARNING, TRITON, OURS,
              *TRACEBACK]


@pytest.mark.parametrize("level, shown", [
    ("error", [OURS, *TRACEBACK]),
    ("warning", [ENGINE_WARNING, TORCH_WARNING, PY_WARNING, PY_WARNING_SOURCE, VLLM_WARNING, TRITON, OURS, *TRACEBACK]),
    ("info", QUICKSTART),
])
def test_the_console_shows_each_level_and_the_file_keeps_every_line(tmp_path, level, shown):
    logs = WorkerLogs(tmp_path / "logs" / "workers.log", level)
    assert logs.keep(batch(QUICKSTART)) == shown
    assert logs.num_hidden == len(QUICKSTART) - len(shown)
    logs.close()
    written = (tmp_path / "logs" / "workers.log").read_text().splitlines()
    assert written == [f"(RolloutWorker(worker-0) pid=24286) {line}" for line in QUICKSTART]


def test_streams_keep_their_own_continuation(tmp_path):
    """A warning's indented source line on stderr is not confused with another process's lines."""
    logs = WorkerLogs(tmp_path / "workers.log", "error")
    assert logs.keep(batch([PY_WARNING], pid=1, is_err=True)) == []
    assert logs.keep(batch([OURS], pid=2)) == [OURS]
    assert logs.keep(batch([PY_WARNING_SOURCE], pid=1, is_err=True)) == []  # continues pid 1's warning
    assert logs.keep(batch(["  indented output of ours"], pid=2)) == ["  indented output of ours"]
    logs.close()


def test_the_filter_replaces_rays_printer_and_stays_after_the_job(tmp_path):
    from ray._private.worker import global_worker_stdstream_dispatcher as dispatcher

    with filtered_worker_logs(tmp_path, "error") as logs:
        assert [name for name, _ in dispatcher.handlers].count("ray_print_logs") == 1
        assert dict(dispatcher.handlers)["ray_print_logs"] == logs.handle
        assert logs.keep(batch([OURS])) == [OURS]
    # late output (an actor's last progress bar) is still filtered, and no longer written
    assert dict(dispatcher.handlers)["ray_print_logs"] == logs.handle
    assert logs.keep(batch([PROGRESS, OURS])) == [OURS]
    assert (tmp_path / "logs" / "workers.log").read_text().splitlines() == [f"(RolloutWorker(worker-0) pid=24286) {OURS}"]
    dispatcher.remove_handler("ray_print_logs")
