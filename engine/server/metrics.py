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

from ..messages import StatsMsg


class StatsSource(Protocol):
    stats: StatsMsg | None  # None until the scheduler sends its first stats (all replicas added up)
    pending_count: int
    # optional: with --dp, each replica's own (the collector reads it with getattr)
    # replica_stats: dict[int, StatsMsg]


# (exposed name, StatsMsg field, help)
_GAUGES = (
    ("minisgl_running_requests", "running", "Requests in the decode batch."),
    ("minisgl_waiting_requests", "waiting", "Requests waiting for prefill."),
    ("minisgl_kv_pages_total", "kv_pages_total", "KV cache pages in the pool."),
    ("minisgl_kv_pages_used", "kv_pages_used", "KV cache pages held by live requests (a cached prefix in use counts)."),
    ("minisgl_kv_pages_cached", "kv_pages_cached", "KV cache pages held only by the radix prefix cache (evictable)."),
    ("minisgl_kv_pages_free", "kv_pages_free", "Free KV cache pages."),
)
# prometheus_client appends "_total" to counter samples, so these are the exposed names.
_COUNTERS = (
    ("minisgl_prompt_tokens_total", "prompt_tokens_total", "Prompt tokens of the requests taken in, those read from the prefix cache included."),
    ("minisgl_generation_tokens_total", "generation_tokens_total", "Tokens generated."),
    ("minisgl_requests_finished_total", "requests_finished_total", "Requests finished (any reason)."),
    ("minisgl_requests_aborted_total", "requests_aborted_total", "Requests aborted."),
    ("minisgl_prefix_cache_hit_tokens_total", "prefix_cache_hit_tokens_total", "Prompt tokens whose KV came from the prefix cache."),
)


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
        if len(replicas) > 1:  # --dp: the same figures per replica, under minisgl_replica_* with a label
            yield from _per_replica(replicas)


def _per_replica(replicas: dict[int, StatsMsg]) -> Iterator[Metric]:
    for name, field, doc in _GAUGES:
        family = GaugeMetricFamily(name.replace("minisgl_", "minisgl_replica_", 1), f"{doc} Per data-parallel replica.", labels=["replica"])
        for replica, stats in sorted(replicas.items()):
            family.add_metric([str(replica)], getattr(stats, field))
        yield family
    for name, field, doc in _COUNTERS:
        family = CounterMetricFamily(name.replace("minisgl_", "minisgl_replica_", 1), f"{doc} Per data-parallel replica.", labels=["replica"])
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
