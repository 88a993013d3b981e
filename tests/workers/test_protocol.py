"""The dispatch protocol (workers/protocol.py), once for each transport: the fleet's on a
real Redis (the messages read back from its queues) and the embedded one on real local
process pools (the steps that ran), both against SQLite.

The same steps must send the same work: a proposal goes to build in chunks and asks for the
next round while the job may pipeline; a sweep sends lost candidates again once each and
leaves alone what is on its way.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest
import redis
from celery import Celery

from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.models import Candidate
from store.settings import Settings
from tests.conftest import free_port
from tests.guarantees.test_guarantee_delivery import _age_dispatch
from workers import tasks
from workers.local import Done, LocalTransport
from workers.protocol import Dispatch, Rounds, Sweeper
from workers.queues import BUILD_QUEUE, EXPLORE_QUEUE, CeleryTransport, QueueWatch, queue_depths

Sent = list[tuple[str, list[int]]]  # (step, candidate ids, or the job id of an explore)


class Harness(Protocol):
    dispatch: Dispatch

    def explore(self, job_id: int) -> None:
        """Run the job's explore step as this transport's dispatcher runs it."""

    def sent(self) -> Sent:
        """What went out since the last call."""

    def lose(self, ids: list[int]) -> None:
        """Lose the messages of these candidates as this transport can lose them."""

    def sweeper(self) -> Sweeper: ...


class CeleryHarness:
    """The fleet: messages on a real Redis, read back from its queues."""

    def __init__(self, settings: Settings, port: int) -> None:
        self.settings = settings
        self.app = Celery("protocol-test", broker=f"redis://127.0.0.1:{port}/0")
        self.redis = redis.Redis(port=port)
        self.dispatch = Dispatch(settings, CeleryTransport(self.app), Rounds.fleet(settings))

    def explore(self, job_id: int) -> None:
        self.dispatch.explore(job_id)  # the body of tctune.explore

    def sent(self) -> Sent:
        out: Sent = []
        for queue in (EXPLORE_QUEUE, BUILD_QUEUE, "measure.h200"):
            while (raw := self.redis.rpop(queue)) is not None:
                msg = json.loads(raw)
                args = json.loads(base64.b64decode(msg["body"]))[0]
                out.append((msg["headers"]["task"].split(".")[1],
                            [args[0]] if isinstance(args[0], int) else args[0]))
        return out

    def lose(self, ids: list[int]) -> None:
        # A broker restart: the queues are emptied, and the sends are long past.
        self.redis.flushall()
        _age_dispatch(self.settings.db_url, ids, 3600)

    def sweeper(self) -> Sweeper:
        watch = QueueWatch(self.settings, lambda qs: queue_depths(self.app, qs),
                           self.dispatch.measure_unbuilt)
        return Sweeper(self.dispatch, watch, free_dead_leases=True)


class LocalHarness:
    """The embedded service: local pools, the steps that ran read back from the futures."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.transport = LocalTransport(settings, Rounds.fleet(settings))
        self.dispatch = Dispatch(settings, self.transport, self.transport.rounds)

    def explore(self, job_id: int) -> None:
        self.transport.send_explore(job_id)  # as the embedded loop: explore, then what follows
        done: list[Done] = []
        while not done:
            done = self.transport.collect(0.2)
        assert [(d.stage, d.error) for d in done] == [("explore", None)]
        self.dispatch.explored(job_id, done[0].result)

    def sent(self) -> Sent:
        done: list[Done] = []
        deadline = time.monotonic() + 120
        while not self.transport.quiet():
            assert time.monotonic() < deadline, "the local steps did not finish"
            done += self.transport.collect(0.2)
        assert all(d.error is None for d in done), done
        return [(d.stage, [d.job_id] if d.stage == "explore" else d.candidate_ids)
                for d in done]

    def lose(self, ids: list[int]) -> None:
        # The service killed and started again: nothing is on its way.
        self.transport.stop()
        self.transport = LocalTransport(self.settings, self.transport.rounds)
        self.dispatch = Dispatch(self.settings, self.transport, self.transport.rounds)

    def sweeper(self) -> Sweeper:
        return Sweeper(self.dispatch, self.transport)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    cfg = Settings(data_dir=tmp_path, backend="simulated", batch_size=8, chunk_size=4,
                   rounds_in_flight=2, max_round=0)
    migrate.upgrade(cfg.db_url)
    return cfg


@pytest.fixture(params=["celery", "local"])
def harness(request: pytest.FixtureRequest, settings: Settings,
            tmp_path: Path) -> Iterator[Harness]:
    if request.param == "local":
        local = LocalHarness(settings)
        yield local
        local.transport.stop()
        return
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server (installed by .ci/run's machine)")
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.1)
        yield CeleryHarness(settings, port)
    finally:
        server.kill()
        server.wait(10)


def _job(db: str, trials: int) -> int:
    with session_scope(db) as s:
        task = repo.get_or_create_task(s, RESNET50_3X3["stage3"], Precision.INT8,
                                       TARGETS["h200"])
        return repo.create_job(s, task, trials, "random", 0).id


def _steps(sent: Sent, step: str) -> list[int]:
    return sorted(i for s, ids in sent if s == step for i in ids)


def test_a_round_goes_to_build_and_the_next_is_asked_for(harness: Harness,
                                                          settings: Settings) -> None:
    job_id = _job(settings.db_url, 32)
    harness.explore(job_id)
    with session_scope(settings.db_url) as s:
        first = sorted(c.id for c in s.query(Candidate).filter(Candidate.round == 1))
    sent = harness.sent()
    assert len(first) == 8
    assert _steps(sent, "build") == first, "every candidate of the round, once"
    assert _steps(sent, "explore") == [job_id], "two rounds in flight: the next is asked for"


def test_a_sweep_sends_lost_candidates_again_once(harness: Harness, settings: Settings) -> None:
    job_id = _job(settings.db_url, 32)
    ids = tasks.explore_round(settings.db_url, job_id, 8).ids  # sent, then lost
    harness.lose(ids)
    sweeper = harness.sweeper()
    swept = sweeper.sweep()
    assert swept.resent == 8 and swept.freed == 0
    assert sweeper.sweep().resent == 0, "what was sent again is on its way"
    assert _steps(harness.sent(), "build") == sorted(ids)


def test_a_rounds_messages_reach_the_broker_together(harness: Harness,
                                                      settings: Settings) -> None:
    if not isinstance(harness, CeleryHarness):
        pytest.skip("the local transport sends to its own pools")
    transport = harness.dispatch.transport
    assert isinstance(transport, CeleryTransport)
    with transport.batch():
        transport.send_measure("h200", [1, 2])
        transport.send_measure("h200", [3])
        assert harness.redis.llen("measure.h200") == 0  # held until the batch closes
    assert harness.sent() == [("measure", [1, 2]), ("measure", [3])]
    with pytest.raises(RuntimeError), transport.batch():
        transport.send_measure("h200", [4])
        raise RuntimeError("the round failed")
    assert harness.sent() == []  # none of a failed batch's messages
    # A round's chunks (4 candidates each here) in order, as one batch.
    harness.dispatch.send(list(range(10, 20)), "h200")
    assert harness.sent() == [("build", [10, 11, 12, 13]), ("build", [14, 15, 16, 17]),
                              ("build", [18, 19])]
