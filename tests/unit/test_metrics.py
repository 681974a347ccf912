"""The metrics catalogue and the actor-side recorder (no Ray: recording outside a worker is a no-op)."""

import pytest

from cluster.metrics import CATALOGUE, ActorMetrics, Metric, MetricsExporter


def test_catalogue_is_consistent():
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names))
    for m in CATALOGUE:
        assert m.recorded_by, m.name
        if m.kind == "histogram":
            assert m.buckets and all(b > 0 for b in m.buckets) and list(m.buckets) == sorted(set(m.buckets)), m.name
        assert "actor" not in m.labels, m.name  # ActorMetrics adds it


def test_actor_metrics_take_only_their_components_families():
    metrics = ActorMetrics("buffer", "buffer")
    assert set(metrics.series) == {m.name for m in CATALOGUE if "buffer" in m.recorded_by}
    metrics.set("buffer_occupancy", 0.5)
    metrics.inc("buffer_dropped", 3, reason="stale")
    metrics.observe("consumed_staleness", 1)
    with pytest.raises(KeyError, match="'learner_version' is not recorded by 'buffer'"):
        metrics.set("learner_version", 1)


def test_driver_exporter_serves_its_families():
    from prometheus_client import generate_latest

    exporter = MetricsExporter(port=None)
    exporter.set("learner_version", 3)
    exporter.observe("consumed_staleness", 2, count=4)
    text = generate_latest(exporter.registry).decode()
    assert "apprentice_learner_version 3.0" in text
    assert 'apprentice_consumed_staleness_bucket{le="2.5"} 4.0' in text
    # A job's own families (its algorithm's gauges) beside the catalogue; never in its place.
    gauges = MetricsExporter(port=None, extra=[Metric("horizon_k", "gauge", "TCOD's horizon.")])
    gauges.set("horizon_k", 2)
    assert "apprentice_horizon_k 2.0" in generate_latest(gauges.registry).decode()
    with pytest.raises(ValueError, match="'learner_version' is already a family of the catalogue"):
        MetricsExporter(port=None, extra=[Metric("learner_version", "gauge", "mine")])
    assert "apprentice_rollout_tokens_total" not in text  # recorded by the rollout actors only


def test_dashboard_queries_name_catalogue_series():
    """... or a built-in algorithm's gauges, which the driver exports beside the catalogue."""
    import json
    import re
    from pathlib import Path

    from learner.algorithms import ALGORITHMS

    dashboard = json.loads((Path(__file__).parents[2] / "cluster" / "grafana_dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    by_name = {m.name: m for m in CATALOGUE}
    by_name |= {g.name: Metric(g.name, "gauge", g.help) for a in ALGORITHMS.values() for g in a.gauges}
    for expr in exprs:
        for ray_prefix, name in re.findall(r"\b(ray_)?apprentice_(\w+)", expr):
            base = re.sub(r"_(total|bucket|count|sum)$", "", name)
            assert base in by_name, expr
            recorders = set(by_name[base].recorded_by)
            if ray_prefix:
                assert recorders - {"driver"}, f"no actor records {base}: {expr}"
            else:
                assert "driver" in recorders, f"the driver does not export {base}: {expr}"


def test_a_labelled_counter_is_exported_at_zero_before_its_first_event():
    from prometheus_client import generate_latest

    from cluster.metrics import MetricsExporter

    exporter = MetricsExporter(port=None)
    exporter.inc("buffer_dropped", 0, reason="stale")
    text = generate_latest(exporter.registry).decode()
    assert 'apprentice_buffer_dropped_total{reason="stale"} 0.0' in text
