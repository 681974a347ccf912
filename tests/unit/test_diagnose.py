"""jobs.diagnose: the position-binned teacher-student gap, and the teacher continuation test."""

import json

import pytest

from buffer.contracts import Turn
from jobs.config import load_config
from jobs.diagnose import gap_by_position, main, run_continuation, student_trajectories
from jobs.train import JobConfig

NANO_JOB = ["model.path=tiny:nano", "rollout.engine=hf", "rollout.num_envs=2", "rollout.group_size=2",
            "rollout.loop.max_turns=2",
            "rollout.sampling.max_new_tokens=8"]


def turn(logprobs):
    n = len(logprobs)
    return Turn(turn_index=0, prompt_ids=(1, 2), response_ids=tuple(range(n)), behaviour_logprobs=tuple(logprobs),
                policy_version=0)


def test_gap_bins_tokens_by_relative_position():
    # A 4-token and a 2-token response, two bins: tokens 0-1 | 2-3 and 0 | 1.
    turns = [turn([-1.0, -1.0, -3.0, -3.0]), turn([-2.0, -4.0])]
    teacher = [(-1.0, -1.0, -1.0, -1.0), (-1.0, -1.0)]
    head, tail = gap_by_position(turns, teacher, num_bins=2)
    assert head == {"position": "0%-50%", "tokens": 3, "student_logprob": pytest.approx(-4 / 3),
                    "teacher_logprob": -1.0, "gap": pytest.approx(-1 / 3)}
    assert tail["tokens"] == 3 and tail["gap"] == pytest.approx((-2 - 2 - 3) / 3)
    with pytest.raises(ValueError):  # a teacher row that does not cover the response
        gap_by_position([turn([-1.0, -1.0])], [(-1.0,)], num_bins=2)


def test_gap_runs_with_the_oracle_teacher_and_counts_every_sampled_token(tmp_path, capsys):
    assert main(["gap", "--episodes", "2", "--bins", "3", "--out", str(tmp_path), *NANO_JOB]) == 0
    rows = json.loads((tmp_path / "gap.json").read_text())["rows"]
    assert [r["position"] for r in rows] == ["0%-33%", "33%-67%", "67%-100%"]
    assert sum(r["tokens"] for r in rows) > 0
    assert "student_logprob" in capsys.readouterr().out


def test_continuation_at_p1_is_the_students_own_format_rate(tmp_path):
    config = load_config(JobConfig, None, [*NANO_JOB, "teacher.backend=hf", "teacher.model.path=tiny:nano"])
    trajectories = student_trajectories(config, 2)
    rows = run_continuation(config, trajectories, [0.0, 0.5, 1.0])
    turns = [t for tr in trajectories for t in tr.turns if t.trainable]
    assert [r["prefix"] for r in rows] == [0.0, 0.5, 1.0] and all(r["turns"] == len(turns) for r in rows)
    assert rows[2]["pass_rate"] == sum(t.well_formed for t in turns) / len(turns)
    assert rows[0]["mean_prefix_tokens"] == 0 and rows[2]["mean_prefix_tokens"] == \
        sum(len(t.response_ids) for t in turns) / len(turns)


def test_continuation_refuses_the_oracle_before_any_episode(capsys):
    assert main(["continuation", *NANO_JOB]) == 2
    assert "teacher.backend=hf" in capsys.readouterr().err
