"""Several teachers: which teacher scores which trajectory, and the config checks at start-up."""

import pytest
from pydantic import ValidationError

from buffer.contracts import Trajectory
from jobs.config import ConfigError, load_config
from jobs.train import JobConfig
from actors.routing import DEFAULT_ROUTE, merge_routed, route_of, split_by_route
from teacher.routing import TeacherRoute, check_routes
from teacher.service import TeacherConfig

ORACLE = TeacherConfig(backend="oracle", top_k=2)
TYPES = ("go_to", "pick_up", "open")


def trajectory(i: int, task_type: str, split: str = "train") -> Trajectory:
    return Trajectory(trajectory_id=f"t{i}", group_id="g", split=split, task_seed=i, task_type=task_type, turns=(),
                      success=False, outcome_reward=0.0, format_reward=0.0)


def test_first_matching_route_wins_and_the_rest_go_to_the_default():
    routes = (TeacherRoute(name="pick", values=("pick_up",), teacher=ORACLE),
              TeacherRoute(name="evalset", field="split", values=("eval",), teacher=ORACLE),
              TeacherRoute(name="also-pick", values=("pick_up", "open"), teacher=ORACLE))
    batch = [trajectory(0, "go_to"), trajectory(1, "pick_up"), trajectory(2, "open"), trajectory(3, "go_to", "eval"),
             trajectory(4, "pick_up", "eval")]
    assert [route_of(t, routes) for t in batch] == [DEFAULT_ROUTE, "pick", "also-pick", "evalset", "pick"]
    parts = split_by_route(batch, routes)
    assert parts == {DEFAULT_ROUTE: [0], "pick": [1, 4], "also-pick": [2], "evalset": [3]}
    # Each teacher answers its own slice; the merge puts every answer back in its place.
    answers = [[f"{name}:{batch[i].trajectory_id}" for i in indices] for name, indices in parts.items()]
    assert merge_routed(len(batch), parts, answers) == ["default:t0", "pick:t1", "also-pick:t2", "evalset:t3",
                                                         "pick:t4"]


def test_unrouted_unknown_and_clashing_routes_are_refused():
    pick = TeacherRoute(name="pick", values=("pick_up",), teacher=ORACLE)
    check_routes((pick,), has_default=True, task_types=TYPES, splits=("train", "eval"))
    with pytest.raises(ValueError, match=r"task types \['go_to', 'open'\] go to no teacher"):
        check_routes((pick,), has_default=False, task_types=TYPES, splits=("train", "eval"))
    everything = TeacherRoute(name="all", field="split", values=("train", "eval"), teacher=ORACLE)
    check_routes((pick, everything), has_default=False, task_types=TYPES, splits=("train", "eval"))
    with pytest.raises(ValueError, match=r"has no task_type \['pickup'\]"):
        check_routes((TeacherRoute(name="x", values=("pickup",), teacher=ORACLE),), True, TYPES, ("train",))
    with pytest.raises(ValueError, match="must be unique"):
        check_routes((pick, pick), True, TYPES, ("train",))
    with pytest.raises(ValidationError, match="needs a resource bundle"):
        TeacherRoute(name="big", values=("go_to",), teacher=TeacherConfig(backend="hf"))


def test_the_job_config_checks_routes_before_anything_starts():
    base = ["env.task_types=[go_to, pick_up]"]
    route = "teacher_routes=[{name: pick, values: [pick_up], teacher: {backend: oracle, top_k: 2}}]"
    config = load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", [*base, route])
    assert config.teacher_routes[0].name == "pick" and config.teacher is not None
    with pytest.raises(ConfigError, match=r"task types \['go_to'\] go to no teacher"):
        load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", [*base, route, "teacher=null"])
    unscored_topk = "teacher_routes=[{name: pick, values: [pick_up], teacher: {backend: oracle}}]"
    with pytest.raises(ConfigError, match="needs every teacher's top-k"):
        load_config(JobConfig, "jobs/configs/babyai_opd_tiny.yaml", [*base, unscored_topk])
    with pytest.raises(ConfigError, match="retire_opd stops its one teacher on a schedule of its own"):
        load_config(JobConfig, "jobs/configs/babyai_retire_tiny.yaml", [*base, route])
