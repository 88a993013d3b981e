"""Prometheus metrics: requests (count, latency by route), jobs by state, measurements by
status, the work waiting in queues and the explorer's work per proposal. All but the
requests are read from the database at scrape time, so every API process reports the same
fleet-wide numbers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from api.broker import Broker
from store import repository as repo
from store.db import session_scope
from store.models import ExplorerStat
from store.settings import Settings

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class FleetCollector(Collector):
    def __init__(self, settings: Settings, broker: Broker | None) -> None:
        self.settings = settings
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("tctune_jobs", "Jobs by state", labels=["state"])
        meas = GaugeMetricFamily("tctune_measurements", "Measurements by status",
                                 labels=["status", "backend"])
        cands = GaugeMetricFamily("tctune_candidates_open",
                                  "Proposed candidates not measured yet", labels=["state"])
        with session_scope(self.settings.db_url) as s:
            counts = repo.fleet_counts(s)
        for state, n in counts.jobs:
            jobs.add_metric([state], n)
        for status, backend, n in counts.measurements:
            meas.add_metric([status, backend], n)
        for state, n in counts.open_candidates:
            cands.add_metric([state], n)
        explorers = counts.explorers
        yield jobs
        yield meas
        yield cands
        yield from _explorer(explorers)
        if self.broker is not None:
            yield self._queues(self.broker)

    def _queues(self, broker: Broker) -> GaugeMetricFamily:
        from kernels.spec import TARGETS
        from workers.app import app as celery_app
        from workers.queues import queue_depths

        depth = GaugeMetricFamily("tctune_queue_depth", "Messages waiting in a broker queue",
                                  labels=["queue"])
        names = ["explore", "build"] + [f"measure.{t}" for t in TARGETS]
        # The broker away: no depths rather than a scrape that waits for it.
        read = partial(queue_depths, celery_app)
        for name, n in (broker.queue_depths(names, read) or {}).items():
            depth.add_metric([name], n)
        return depth


def _explorer(rows: list[ExplorerStat]) -> Iterator[Metric]:
    """The sums over every explorer process that ever wrote (workers/explorer_stats.py)."""
    from workers.explorer_stats import BUCKETS, bucket_key

    per_bucket = {bucket_key(b): 0 for b in (*BUCKETS, float("inf"))}
    for row in rows:
        for le, n in row.buckets.items():
            per_bucket[le] = per_bucket.get(le, 0) + n
    cumulative, total = [], 0
    for le in sorted(per_bucket, key=float):  # float("+Inf") is inf
        total += per_bucket[le]
        cumulative.append((le, total))
    yield HistogramMetricFamily(
        "tctune_explorer_proposal_seconds", "Wall seconds of each explorer proposal",
        buckets=cumulative, sum_value=sum(r.seconds_sum for r in rows))
    fits = CounterMetricFamily(
        "tctune_explorer_model_fits", "Cost-model boosters the explorer trained: from "
        "scratch, or boosted further (extend)", labels=["kind"])
    fits.add_metric(["scratch"], sum(r.fits_scratch for r in rows))
    fits.add_metric(["extend"], sum(r.fits_extend for r in rows))
    yield fits
    yield CounterMetricFamily("tctune_explorer_proposed", "Candidates the explorer proposed",
                              value=sum(r.proposed for r in rows))


class Metrics:
    def __init__(self, settings: Settings, broker: Broker | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("tctune_http_requests", "HTTP requests",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("tctune_http_request_seconds", "HTTP request latency",
                                 ["method", "route"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.registry.register(FleetCollector(settings, broker))


class MetricsMiddleware:
    """Counts and times every request under its route template (not the raw path, so
    that /jobs/1 and /jobs/2 are one series)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = _route_of(scope)
            self.metrics.requests.labels(scope["method"], route, str(status["code"])).inc()
            self.metrics.latency.labels(scope["method"], route).observe(
                time.perf_counter() - start)


def _route_of(scope: Any) -> str:
    """The matched route's template; the router leaves it in the scope."""
    return getattr(scope.get("route"), "path", "unmatched")
