"""Prometheus /metrics, read from the scheduler's latest StatsMsg at scrape time.

The scheduler already keeps the totals, so a custom collector re-exposes them instead of
counting a second time in the front end. Each app gets its own registry: no global state, and
tests can build as many apps as they like.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..messages import StatsMsg, stats_metrics


class StatsSource(Protocol):
    stats: StatsMsg | None  # None until the scheduler sends its first stats (all replicas added up)
    pending_count: int
    # optional: with --dp, each replica's own (the collector reads it with getattr)
    # replica_stats: dict[int, StatsMsg]


# (exposed name, StatsMsg field, help), as StatsMsg declares them
_GAUGES = tuple((m.name, field, m.help) for field, m in stats_metrics() if m.kind == "gauge")
_COUNTERS = tuple((m.name, field, m.help) for field, m in stats_metrics() if m.kind == "counter")


class StatsCollector(Collector):
    """Turns ``source.stats`` into metric families on every scrape. Before the first StatsMsg
    only the front end's own gauge is exposed, rather than zeros that would look real."""

    def __init__(self, source: StatsSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "minisgl_frontend_pending_requests",
            "Requests the front end is tracking (per-uid state).",
            value=self._source.pending_count,
        )
        stats = self._source.stats
        if stats is None:
            return
        for name, field, doc in _GAUGES:
            yield GaugeMetricFamily(name, doc, value=getattr(stats, field))
        for name, field, doc in _COUNTERS:
            yield CounterMetricFamily(name, doc, value=getattr(stats, field))
        replicas = getattr(self._source, "replica_stats", {})
        if (
            len(replicas) > 1
        ):  # --dp: the same figures per replica, under minisgl_replica_* with a label
            yield from _per_replica(replicas)


def _per_replica(replicas: dict[int, StatsMsg]) -> Iterator[Metric]:
    for name, field, doc in _GAUGES:
        family = GaugeMetricFamily(
            name.replace("minisgl_", "minisgl_replica_", 1),
            f"{doc} Per data-parallel replica.",
            labels=["replica"],
        )
        for replica, stats in sorted(replicas.items()):
            family.add_metric([str(replica)], getattr(stats, field))
        yield family
    for name, field, doc in _COUNTERS:
        family = CounterMetricFamily(
            name.replace("minisgl_", "minisgl_replica_", 1),
            f"{doc} Per data-parallel replica.",
            labels=["replica"],
        )
        for replica, stats in sorted(replicas.items()):
            family.add_metric([str(replica)], getattr(stats, field))
        yield family


def create_registry(source: StatsSource) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(source))
    return registry


def metrics_router(source: StatsSource) -> APIRouter:
    """GET /metrics for ``source``; left open even with an API key (no prompt text in it)."""
    registry = create_registry(source)
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
