"""The metrics catalogue (named once) and the job driver's Prometheus endpoint.

The driver collects stats from every actor each step and exports them on one scrape target
(prometheus-client, 127.0.0.1 by default). Names carry the `apprentice_` prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Metric:
    """One series family."""

    name: str
    kind: Literal["gauge", "counter", "histogram"]
    help: str
    labels: tuple[str, ...] = ()


CATALOGUE: tuple[Metric, ...] = (
    Metric("rollout_tokens_per_s", "gauge", "Generated tokens per second over the last step, all workers."),
    Metric("episodes", "counter", "Finished episodes.", ("task_type", "outcome")),
    Metric("buffer_occupancy", "gauge", "Resident samples / capacity."),
    Metric("buffer_dropped", "counter", "Samples dropped by the buffer.", ("reason",)),
    Metric("consumed_staleness", "histogram", "Staleness (learner version - sample version) of consumed samples."),
    Metric("learner_version", "gauge", "Policy version of the learner."),
    Metric("learner_step_seconds", "gauge", "Learner step time."),
    Metric("learner_idle_seconds", "gauge", "Learner time waiting for data in the last step."),
    Metric("weight_sync_seconds", "gauge", "Time to publish weights to the rollout workers."),
    Metric("teacher_latency_seconds", "gauge", "Teacher request latency (p50)."),
    Metric("teacher_batch_turns", "gauge", "Mean turns per teacher batch."),
    Metric("eval_success", "gauge", "Eval success rate.", ("task_type",)),
    Metric("opd_reverse_kl", "gauge", "Mean reverse KL(student || teacher) on sampled tokens."),
    Metric("opd_lambda", "gauge", "λ of the joint loss."),
    Metric("teacher_retired", "gauge", "1 once the teacher is retired."),
    Metric("horizon_k", "gauge", "TCOD horizon k in force."),
    Metric("format_error_rate", "gauge", "Share of turns whose response did not parse."),
)


class MetricsExporter:
    """prometheus-client series for the catalogue, on its own registry and HTTP endpoint."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = 9400) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        self.registry = CollectorRegistry()
        kinds = {"gauge": Gauge, "counter": Counter}
        self.series = {}
        for m in CATALOGUE:
            name = f"apprentice_{m.name}"
            if m.kind == "histogram":
                self.series[m.name] = Histogram(name, m.help, m.labels, registry=self.registry,
                                                buckets=(0, 1, 2, 3, 4, 6, 8))
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
        if amount > 0:
            series = self.series[name]
            (series.labels(**labels) if labels else series).inc(amount)

    def observe(self, name: str, value: float, count: int = 1) -> None:
        for _ in range(count):
            self.series[name].observe(value)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
