"""TensorBoard event files of step records, read back with tensorboard's own reader."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jobs.tensorboard import TensorBoardLog, scalars
from tests.unit.test_records import record


def test_every_number_of_a_record_becomes_a_scalar_at_its_version(tmp_path):
    log = TensorBoardLog(tmp_path)
    first = record(7, episodes=12, train_success_rate=0.25, eval_success=0.5,
                   eval_success_by_type={"go_to": 1.0, "pick_up": 0.0})
    log.record(first)
    log.record(record(8, episodes=20))  # no eval, no train rate this step
    log.scalar("warm_start/loss", 1.5, 3)
    log.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])

    def points(tag):
        return [(e.step, e.value) for e in events.Scalars(tag)]

    assert points("rollout/episodes") == [(7, 12.0), (8, 20.0)]
    assert points("learner/loss") == [(7, pytest.approx(0.1)), (8, pytest.approx(0.1))]
    assert points("eval/eval_success") == [(7, 0.5)] and points("rollout/train_success_rate") == [(7, 0.25)]
    assert points("eval/eval_success_by_type/pick_up") == [(7, 0.0)]
    # Per-turn lists: one tag per turn index; a turn with no token (None) is left out.
    assert "kl/reverse_kl_by_turn/00" in tags and "kl/reverse_kl_by_turn/01" not in tags
    assert points("warm_start/loss") == [(3, 1.5)]
    assert "version" not in {tag.split("/")[-1] for tag in tags}
    # The trained samples' staleness (versions 6 and 5 trained by the step from version 6 to 7).
    histogram = events.Histograms("learner/staleness")[0]
    assert histogram.step == 7 and histogram.histogram_value.num == 2 and histogram.histogram_value.max == 1


def test_none_values_are_not_logged():
    tags = {tag for tag, _ in scalars(record(3, turns_to_success=None, reverse_kl_head=None))}
    assert "rollout/turns_to_success" not in tags and "kl/reverse_kl_head" not in tags
    assert "kl/reverse_kl_tail" in tags
