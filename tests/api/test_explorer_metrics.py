"""GET /metrics reports the explorer's work per proposal, read from the database: real
proposals (explore_round on measured jobs), then a scrape through the API, on SQLite and
on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import repository as repo
from store.db import session_scope
from store.settings import Settings
from workers import explorer_stats, tasks
from workers.backends.simulated import SimulatedBackend

H200 = TARGETS["h200"]
SHAPE = RESNET50_3X3["stage5"]  # the smallest space: a model-based proposal in seconds


@pytest.fixture
def fresh_stats() -> Iterator[None]:
    """The explorer's counts start at 0 (nothing recorded by an earlier test of this
    process) and none is left for the next."""
    explorer_stats.reset()
    yield
    explorer_stats.reset()


@pytest.fixture
def client(db: str, tmp_path: Path, fresh_stats: None) -> Iterator[TestClient]:
    """An API (no dispatcher) on the test's database; the explorer's counts start at 0."""
    settings = Settings(data_dir=tmp_path, database_url=db, backend="simulated", auth="off")
    with TestClient(create_app(settings, dispatcher=False)) as c:
        yield c


def _job(url: str, strategy: str, trials: int, **options: object) -> int:
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, SHAPE, Precision.INT8, H200)
        return repo.create_job(s, task, trials, strategy, 0, strategy_options=options).id


def _rounds(url: str, job_id: int, rounds: int, batch: int) -> int:
    """Propose and measure (simulated) `rounds` rounds; returns the candidates proposed."""
    backend = SimulatedBackend(H200)
    proposed = 0
    for _ in range(rounds):
        ids = tasks.explore_round(url, job_id, batch).ids
        assert len(ids) == batch
        assert tasks.measure_chunk(url, ids, backend, "w", 60).written == batch
        proposed += len(ids)
    return proposed


def _scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(resp.text) for s in fam.samples}


def _settled(client: TestClient, proposals: int, timeout: float = 15.0) -> dict[
        tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scrape once `proposals` are written: the first write of a burst is at once, the
    rest within explorer_stats.FLUSH_EVERY_S (a deferred write), without being asked."""
    deadline = time.monotonic() + timeout
    while True:
        got = _scrape(client)
        count = got[("tctune_explorer_proposal_seconds_count", ())]
        assert count <= proposals
        if count == proposals or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_model_based_proposals_are_timed_and_their_fits_counted(client: TestClient,
                                                                 db: str) -> None:
    before = _scrape(client)
    assert before[("tctune_explorer_proposal_seconds_count", ())] == 0
    assert before[("tctune_explorer_model_fits_total", (("kind", "scratch"),))] == 0
    # One booster and no rank voices: what is counted, not the model's quality, is tested
    # here, and the second round is then seconds, not a minute, on a loaded machine. A first
    # design of 16, the first round: the second is model-guided once it is measured.
    proposed = _rounds(db, _job(db, "diversity", 64, bags=1, rank_voices=0, first_n=16), 2,
                       16)
    got = _settled(client, 2)
    assert got[("tctune_explorer_proposal_seconds_count", ())] == 2
    assert got[("tctune_explorer_proposal_seconds_sum", ())] > 0
    assert got[("tctune_explorer_proposal_seconds_bucket", (("le", "+Inf"),))] == 2
    buckets = sorted((float(labels[0][1]), v) for (name, labels), v in got.items()
                     if name == "tctune_explorer_proposal_seconds_bucket")
    assert [le for le, _ in buckets] == [*explorer_stats.BUCKETS, float("inf")]
    assert all(a <= b for (_, a), (_, b) in zip(buckets, buckets[1:], strict=False))
    # The second round learns from the first's measurements: a booster from scratch.
    assert got[("tctune_explorer_model_fits_total", (("kind", "scratch"),))] > 0
    assert got[("tctune_explorer_proposed_total", ())] == proposed


def test_random_proposals_fit_no_model(client: TestClient, db: str) -> None:
    proposed = _rounds(db, _job(db, "random", 32), 2, 16)
    got = _settled(client, 2)
    assert got[("tctune_explorer_proposal_seconds_count", ())] == 2
    assert got[("tctune_explorer_proposal_seconds_sum", ())] > 0
    assert got[("tctune_explorer_model_fits_total", (("kind", "scratch"),))] == 0
    assert got[("tctune_explorer_model_fits_total", (("kind", "extend"),))] == 0
    assert got[("tctune_explorer_proposed_total", ())] == proposed


def test_counts_add_up_across_writes_and_explorer_processes(db: str, fresh_stats: None) -> None:
    """A write adds to the process's row (never sets it), and the scrape sums every row:
    an explorer that is gone still counts. A proposal counts the boosters trained since
    the one before, from scratch and boosted further."""
    import numpy as np
    from sqlalchemy import select

    from search.cost_model import CostModel, Rows
    from store.models import ExplorerStat

    rng = np.random.default_rng(0)
    rows = Rows(rng.random((40, 3)), rng.random(40), np.zeros(40, dtype=int))
    CostModel("reg", rounds=2, bags=2).fit(rows).extended(rows, rounds=1)
    explorer_stats.record_proposal(0.02, 4)
    explorer_stats.flush(db, force=True)
    explorer_stats.record_proposal(3.0, 5)
    explorer_stats.flush(db, force=True)
    explorer_stats._write(db, "gone-host:1", explorer_stats._Counts(
        proposals=1, seconds_sum=20.0, buckets={"+Inf": 1}, proposed=7))
    with session_scope(db) as s:
        rows = {r.name: r for r in s.scalars(select(ExplorerStat))}
    mine = rows[explorer_stats.process_name()]
    assert (mine.proposals, mine.proposed) == (2, 9)
    assert (mine.fits_scratch, mine.fits_extend) == (2, 2)
    assert mine.buckets == {"0.025": 1, "5.0": 1}
    assert mine.seconds_sum == pytest.approx(3.02)
    settings = Settings(database_url=db, backend="simulated", auth="off")
    with TestClient(create_app(settings, dispatcher=False)) as c:
        got = _scrape(c)
    assert got[("tctune_explorer_proposal_seconds_count", ())] == 3
    assert got[("tctune_explorer_proposal_seconds_sum", ())] == pytest.approx(23.02)
    assert got[("tctune_explorer_proposal_seconds_bucket", (("le", "0.01"),))] == 0
    assert got[("tctune_explorer_proposal_seconds_bucket", (("le", "0.025"),))] == 1
    assert got[("tctune_explorer_proposal_seconds_bucket", (("le", "2.5"),))] == 1
    assert got[("tctune_explorer_proposal_seconds_bucket", (("le", "5.0"),))] == 2
    assert got[("tctune_explorer_proposal_seconds_bucket", (("le", "10.0"),))] == 2
    assert got[("tctune_explorer_proposed_total", ())] == 16
    assert got[("tctune_explorer_model_fits_total", (("kind", "scratch"),))] == 2
    assert got[("tctune_explorer_model_fits_total", (("kind", "extend"),))] == 2


def test_a_failed_write_fails_no_proposal_and_keeps_its_counts(tmp_path: Path,
                                                               fresh_stats: None) -> None:
    """No table (a database not migrated): the write fails, nothing raises, and the counts
    go with the next write, once there is a table."""
    from store import migrate

    url = f"sqlite:///{tmp_path / 'late.db'}"
    explorer_stats.record_proposal(0.5, 3)
    explorer_stats.flush(url, force=True)  # must not raise
    migrate.upgrade(url)
    explorer_stats.flush(url, force=True)
    with session_scope(url) as s:
        from store.models import ExplorerStat

        row = s.get(ExplorerStat, explorer_stats.process_name())
        assert row is not None and (row.proposals, row.proposed) == (1, 3)


def test_on_sqlite_a_write_does_not_wait_on_the_explorer_s_own_lock(tmp_path: Path,
                                                                    fresh_stats: None) -> None:
    """The explorer records inside its transaction, which may hold SQLite's write lock
    (it re-marked open candidates as sent): the write gives up at once instead of waiting
    the usual 30 s on itself, and goes with a later one."""
    from store import migrate
    from store.models import ExplorerStat

    url = f"sqlite:///{tmp_path / 'locked.db'}"
    migrate.upgrade(url)
    with session_scope(url) as s:
        repo.create_token(s, "holds the write lock", "read")
        s.flush()
        explorer_stats.record_proposal(0.1, 2)
        started = time.monotonic()
        explorer_stats.flush(url, force=True)
        assert time.monotonic() - started < 5
    explorer_stats.flush(url, force=True)
    with session_scope(url) as s:
        row = s.get(ExplorerStat, explorer_stats.process_name())
        assert row is not None and (row.proposals, row.proposed) == (1, 2)
