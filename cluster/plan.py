"""Resource plans: how many rollout, teacher and learner actors, and what each needs.

Presets: `cpu` fits the embedded 2-core default with fractional CPUs; `gpu-8` mirrors the
seeds' 8-GPU split (4 rollout engines, 2 learner ranks, 2 teacher GPUs). Environment actors
(`rollout.env_actors`, for slow environments such as ALFWorld) are a role of their own, so
their CPUs are reserved with the rest instead of being taken from the engines'. A plan is checked
against `ray.cluster_resources()` before any actor starts, and reserved as one placement
group (a bundle per actor; `spread_learner` gives the learner ranks a STRICT_SPREAD group of their
own), so a plan that cannot fit fails fast with the numbers.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


ROLES = ("rollout", "teacher", "learner", "judge", "env")
"""In bundle order."""


class RolePlan(BaseModel):
    """Actors of one role and what each needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(ge=0)
    cpus: float = Field(ge=0)
    gpus: float = Field(default=0.0, ge=0)

    @property
    def reserves(self) -> bool:
        """Whether each actor needs a bundle (an actor that needs nothing is not reserved)."""
        return self.cpus > 0 or self.gpus > 0


class ResourcePlan(BaseModel):
    """The whole job's actors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["cpu", "gpu-8", "custom"] = "cpu"
    rollout: RolePlan = RolePlan(count=1, cpus=1.0)
    teacher: RolePlan = RolePlan(count=1, cpus=0.0)
    learner: RolePlan = RolePlan(count=1, cpus=1.0)
    judge: RolePlan = RolePlan(count=0, cpus=0.0)
    """The judge service of turn_judge (at most one): a bundle where it serves its own judge model."""
    env: RolePlan = RolePlan(count=0, cpus=0.0)
    """Environment actors (rollout.env_actors), one bundle each: every rollout worker has a set of
    rollout.num_envs for rollout and another for evaluations (which may run beside rollout), so
    count is rollout.count x num_envs x 2 (the job config checks it); count 0 leaves them
    unreserved (they then take no CPUs from the plan)."""
    rollout_tensor_parallel: int = Field(default=1, ge=1)
    """vLLM tensor parallelism of each rollout engine (GPU preset)."""
    spread_learner: bool = False
    """Put each learner rank on a node of its own (its bundles form a STRICT_SPREAD placement
    group; the other roles still PACK): e.g. one rank per node on nodes of 4 GPUs, so each node
    keeps host memory and NICs for rollout. The ranks then talk across nodes (NCCL/gloo over the
    network: set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, README). False: every bundle PACKs."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """The preset's roles under the given ones, key by key (`rollout: {cpus: 0.5}` keeps the
        preset's rollout count)."""
        if isinstance(data, dict) and isinstance(data.get("preset"), str) and data["preset"] in PRESETS:
            preset = PRESETS[data["preset"]]
            return {**preset, **{k: {**preset[k], **v} if isinstance(v, dict) and k in preset else v
                                 for k, v in data.items()}}
        return data

    @model_validator(mode="after")
    def _one_judge(self) -> "ResourcePlan":
        if self.judge.count > 1:
            raise ValueError(f"judge.count must be 0 or 1 (one judge service per job), got {self.judge.count}")
        return self

    def needs(self) -> dict[str, float]:
        roles = [getattr(self, name) for name in ROLES]
        return {"CPU": sum(r.count * r.cpus for r in roles), "GPU": sum(r.count * r.gpus for r in roles)}

    def bundles(self, roles: tuple[str, ...] = ROLES) -> list[dict[str, float]]:
        """One bundle per actor of `roles` that needs resources (zero-resource actors need no reservation)."""
        out = []
        for role in (getattr(self, name) for name in roles):
            if role.reserves:
                out += [{k: v for k, v in (("CPU", role.cpus), ("GPU", role.gpus)) if v > 0}] * role.count
        return out

    def groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """The placement groups to reserve, in order: (strategy, roles). The spread learner goes
        first: packed first, the other roles could fill a node and leave no room to spread."""
        if self.spread_learner and self.learner.reserves:
            return [("STRICT_SPREAD", ("learner",)), ("PACK", tuple(r for r in ROLES if r != "learner"))]
        return [("PACK", ROLES)]

    def describe(self) -> str:
        lines = [f"resource plan ({self.preset}):"]
        for name in ROLES:
            r: RolePlan = getattr(self, name)
            if name in ("judge", "env") and r.count == 0:
                continue
            lines.append(f"  {name:<8} {r.count} x ({r.cpus:g} CPU, {r.gpus:g} GPU)")
        need = self.needs()
        lines.append(f"  total    {need['CPU']:g} CPU, {need['GPU']:g} GPU")
        return "\n".join(lines)

    def check(self, available: dict[str, float]) -> None:
        """Raise with need vs have when the cluster cannot hold the plan."""
        need = self.needs()
        short = {k: (v, available.get(k, 0.0)) for k, v in need.items() if v > available.get(k, 0.0) + 1e-9}
        if short:
            detail = ", ".join(f"{k}: need {n:g}, have {h:g}" for k, (n, h) in short.items())
            raise ValueError(f"the resource plan does not fit the cluster ({detail})\n{self.describe()}")


PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"rollout": {"count": 1, "cpus": 1.0}, "teacher": {"count": 1, "cpus": 0.0},
            "learner": {"count": 1, "cpus": 1.0}},
    "gpu-8": {"rollout": {"count": 4, "cpus": 2.0, "gpus": 1.0}, "teacher": {"count": 2, "cpus": 2.0, "gpus": 1.0},
              "learner": {"count": 2, "cpus": 2.0, "gpus": 1.0}},
}


def reserve(plan: ResourcePlan, timeout_s: float = 120.0):
    """The placement groups of the plan (`ResourcePlan.groups`), and each role's scheduling strategies."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    plan.check(ray.cluster_resources())
    groups, strategies = [], {}
    for strategy, roles in plan.groups():
        bundles = plan.bundles(roles)
        if not bundles:
            strategies.update({name: ["DEFAULT"] * max(getattr(plan, name).count, 1) for name in roles})
            continue
        group = placement_group(bundles, strategy=strategy)
        groups.append(group)
        if not group.wait(timeout_s):
            raise TimeoutError(f"could not reserve {bundles} ({strategy}) within {timeout_s} s\n{plan.describe()}")
        index = 0
        for name in roles:
            role = getattr(plan, name)
            if not role.reserves:
                strategies[name] = ["DEFAULT"] * max(role.count, 1)
                continue
            strategies[name] = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index + i)
                                for i in range(role.count)]
            index += role.count
    return groups, strategies


def release(groups: list, timeout_s: float = 60.0, remove: Callable[[Any], None] | None = None) -> None:
    """Remove the placement groups `reserve` made, waiting at most `timeout_s` in all. Ray's call
    has no deadline of its own: a job whose raylet had been killed was seen blocked in it (py-spy
    dump of its close), though a plain reproduction (raylet killed, then the call) returned at
    once. TimeoutError then says so instead of a job that never exits. `remove`: Ray's
    remove_placement_group (a test's stand-in)."""
    import threading

    if remove is None:
        from ray.util.placement_group import remove_placement_group as remove
    done = threading.Event()

    def remove_all() -> None:
        for group in groups:
            remove(group)
        done.set()

    threading.Thread(target=remove_all, name="release-placement-groups", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"Ray did not remove the run's {len(groups)} placement group(s) within {timeout_s:.0f} s: "
                           f"the cluster does not answer (is this node's raylet alive? `ray status`); the job exits "
                           f"and Ray frees a job's placement groups when it ends")
