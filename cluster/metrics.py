"""The metrics catalogue (named once) and its two exporters.

- `MetricsExporter`: the job driver's prometheus-client endpoint (127.0.0.1 by default), one
  scrape target with the run-level view the driver assembles each step.
- `ActorMetrics`: `ray.util.metrics` series recorded inside the actors, exported by Ray's
  per-node metrics agent (prefixed `ray_`, counters suffixed `_total`) and shown by the
  Ray dashboard's Grafana panels; each series carries an `actor` tag.

Names carry the `apprentice_` prefix; `recorded_by` says which processes record a family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

Recorder = Literal["driver", "rollout", "buffer", "teacher", "learner", "judge"]


@dataclass(frozen=True)
class Metric:
    """One series family."""

    name: str
    kind: Literal["gauge", "counter", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    recorded_by: tuple[Recorder, ...] = ("driver",)
    """The job driver and/or the actor components that record it."""
    buckets: tuple[float, ...] = ()
    """Histogram bucket upper bounds (positive, increasing)."""


STALENESS_BUCKETS = (0.5, 1.5, 2.5, 3.5, 4.5, 8.5)
"""Staleness is an integer: bucket le=0.5 holds staleness 0, le=1.5 staleness <= 1, ..."""

CATALOGUE: tuple[Metric, ...] = (
    Metric("rollout_tokens_per_s", "gauge", "Generated tokens per second over the last step, all workers."),
    Metric("rollout_tokens", "counter", "Generated response tokens.", recorded_by=("rollout",)),
    Metric("rollout_prompt_tokens_per_turn", "gauge",
           "Mean prompt tokens per agent turn over the episodes finished since the last step (what each "
           "turn costs to prefill, and the learner to train on when turns do not nest)."),
    Metric("rollout_turns", "counter", "Agent turns, by whether the response parsed as a tool call.",
           ("format",), recorded_by=("rollout",)),
    Metric("episodes", "counter", "Finished episodes.", ("task_type", "outcome"), recorded_by=("driver", "rollout")),
    Metric("buffer_occupancy", "gauge", "Resident samples / capacity.", recorded_by=("driver", "buffer")),
    Metric("buffer_dropped", "counter", "Samples dropped by the buffer.", ("reason",),
           recorded_by=("driver", "buffer")),
    Metric("consumed_staleness", "histogram", "Staleness (learner version - sample version) of consumed samples.",
           recorded_by=("driver", "buffer"), buckets=STALENESS_BUCKETS),
    Metric("learner_version", "gauge", "Policy version of the learner.", recorded_by=("driver", "learner")),
    Metric("learner_step_seconds", "gauge", "Learner step time.", recorded_by=("driver", "learner")),
    Metric("learner_idle_seconds", "gauge", "Learner time waiting for data in the last step."),
    Metric("weight_sync_seconds", "gauge", "Time to publish weights to the rollout workers."),
    Metric("weight_load_seconds", "histogram", "Time for a rollout worker to fetch and load new weights.",
           recorded_by=("rollout",), buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30)),
    Metric("teacher_latency_seconds", "gauge", "Teacher request latency (p50)."),
    Metric("actor_restarts", "counter", "Restarts of dead actors, by component.", ("component",)),
    Metric("agent_failures", "counter", "Episodes whose agent program failed (env.name=gateway): crashed, no reward, "
           "timed out."),
    Metric("nonfinite_steps", "counter", "Learner steps skipped: their loss or gradient norm was not finite."),
    Metric("empty_batches", "counter", "Learner steps skipped: the batch held no trainable token."),
    Metric("job_recoveries", "counter", "Times the job rebuilt its actors from a checkpoint after a failure."),
    Metric("teacher_rejected_trajectories", "counter",
           "Trajectories a teacher scored with a non-finite or positive log-prob (not trained on).",
           recorded_by=("teacher",)),
    Metric("teacher_request_seconds", "histogram", "Teacher scoring time per request.", recorded_by=("teacher",),
           buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30)),
    Metric("teacher_batch_turns", "gauge", "Mean turns per teacher batch.", recorded_by=("driver", "teacher")),
    Metric("eval_success", "gauge", "Eval success rate.", ("task_type",)),
    Metric("opd_reverse_kl", "gauge", "Mean reverse KL(student || teacher) on sampled tokens.",
           recorded_by=("driver", "learner")),
    Metric("learner_mismatch_kl", "gauge", "k3 estimate of KL(engine || learner) on the trained tokens."),
    Metric("learner_ratio_mean", "gauge", "Mean importance ratio learner / engine on the trained tokens."),
    Metric("learner_ratio_max", "gauge", "Largest importance ratio learner / engine of a trained token."),
    Metric("learner_masked_frac", "gauge", "Share of trained tokens left out by the mismatch masks."),
    Metric("learner_truncated_frac", "gauge", "Share of trained tokens whose importance weight was truncated."),
    Metric("teacher_stopped", "gauge", "1 once the algorithm's schedule has stopped the teacher for good."),
    Metric("judge_turns", "counter", "Turns the judge scored, by result (ok, or neutral: no score after retries).",
           ("result",), recorded_by=("judge",)),
    Metric("format_error_rate", "gauge", "Share of turns whose response did not parse (episodes since the last step)."),
)
_BY_NAME = {m.name: m for m in CATALOGUE}


class ActorMetrics:
    """`ray.util.metrics` series of the catalogue families `component` records, tagged `actor`.

    Created inside an actor; recording a family the catalogue does not give to `component`
    is an error (the catalogue stays the one place that says who exports what).
    """

    def __init__(self, component: Recorder, actor: str) -> None:
        from ray.util import metrics

        self.component = component
        self.tags = {"actor": actor}
        self.series = {}
        for m in CATALOGUE:
            if component not in m.recorded_by:
                continue
            name, keys = f"apprentice_{m.name}", m.labels + ("actor",)
            if m.kind == "histogram":
                self.series[m.name] = metrics.Histogram(name, m.help, boundaries=list(m.buckets), tag_keys=keys)
            elif m.kind == "counter":
                self.series[m.name] = metrics.Counter(name, m.help, tag_keys=keys)
            else:
                self.series[m.name] = metrics.Gauge(name, m.help, tag_keys=keys)

    def _series(self, name: str):
        if name not in self.series:
            raise KeyError(f"metric {name!r} is not recorded by {self.component!r} (see cluster.metrics.CATALOGUE)")
        return self.series[name]

    def set(self, name: str, value: float, **labels: str) -> None:
        self._series(name).set(value, tags={**labels, **self.tags})

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        if amount > 0:
            self._series(name).inc(amount, tags={**labels, **self.tags})

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._series(name).observe(value, tags={**labels, **self.tags})


class MetricsExporter:
    """prometheus-client series of the families the driver records, on its own registry and HTTP endpoint."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = 9400, extra: Sequence[Metric] = ()) -> None:
        """`extra`: families of the job's own beside the catalogue (its algorithm's gauges)."""
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        self.registry = CollectorRegistry()
        kinds = {"gauge": Gauge, "counter": Counter}
        self.series = {}
        for m in (*CATALOGUE, *extra):
            if "driver" not in m.recorded_by:
                continue
            if m.name in self.series:
                raise ValueError(f"metric {m.name!r} is already a family of the catalogue (cluster/metrics.py)")
            name = f"apprentice_{m.name}"
            if m.kind == "histogram":
                self.series[m.name] = Histogram(name, m.help, m.labels, registry=self.registry, buckets=m.buckets)
            else:
                self.series[m.name] = kinds[m.kind](name, m.help, m.labels, registry=self.registry)
        self.server = None
        if port is not None:
            self.server, _ = start_http_server(port, addr=host, registry=self.registry)
        self.port = port

    def set(self, name: str, value: float, **labels: str) -> None:
        series = self.series[name]
        (series.labels(**labels) if labels else series).set(value)

    def inc(self, name: str, amount: float, **labels: str) -> None:
        series = self.series[name]
        # Creating the labelled child exports it at 0 before its first event, so a query (or a
        # dashboard panel) over a counter that has not moved yet finds the series.
        child = series.labels(**labels) if labels else series
        if amount > 0:
            child.inc(amount)

    def observe(self, name: str, value: float, count: int = 1) -> None:
        for _ in range(count):
            self.series[name].observe(value)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()  # the port is free again (a recovery serves on it anew)
