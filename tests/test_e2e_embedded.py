"""The whole path on the embedded default: POST /tune -> explorer -> build -> measure ->
database -> GET /schedule, through a real `tctune serve` process, and a restart mid-job."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import func, select

from bench._procs import proc_stats
from store.db import session_scope
from store.models import Measurement
from tests.conftest import Service

STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": [1, 1]}
QUERY = dict(n=8, h=56, w=56, c=64, k=64, r=3, s=3, pad=1, precision="int8", target="h200")


def _wait(url: str, job_id: int, until: Callable[[dict], bool], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{url}/jobs/{job_id}", timeout=10).json()
        if until(state):
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not get there: {state}")


def test_tune_stage2_int8_end_to_end(make_service: Callable[..., Service]) -> None:
    svc = make_service().start()
    resp = httpx.post(f"{svc.url}/tune", json={"shape": STAGE2, "precision": "int8",
                                               "target": "h200", "trials": 64},
                      headers=svc.headers)
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["job_id"]
    state = _wait(svc.url, job_id, lambda s: s["status"] == "done")
    assert state["trials_done"] == 64 and state["trials"] == 64
    assert state["simulated"] is True

    history = state["measurements"]
    assert [m["trial"] for m in history] == list(range(1, 65))
    assert len({m["schedule_hash"] for m in history}) == 64
    ok = [m for m in history if m["status"] == "ok"]
    best = min(ok, key=lambda m: m["median_us"])

    got = httpx.get(f"{svc.url}/schedule", params=QUERY)
    assert got.status_code == 200, got.text
    sched = got.json()
    assert sched["schedule"] == best["schedule"]
    assert sched["latency_us"] == best["median_us"]
    assert sched["simulated"] is True and sched["backend"] == "simulated"
    assert sched["job_id"] == job_id

    # ?after=N returns only newer measurements.
    tail = httpx.get(f"{svc.url}/jobs/{job_id}", params={"after": history[59]["id"]}).json()
    assert [m["trial"] for m in tail["measurements"]] == [61, 62, 63, 64]


@pytest.mark.guarantee
@pytest.mark.parametrize("measure_processes", ["1", "2"])
def test_job_survives_sigkill_of_the_service(make_service: Callable[..., Service],
                                             measure_processes: str) -> None:
    # Slow simulated measurements so that the kill lands mid-job; with two measuring
    # processes (a host of two GPUs) candidates are measured two at a time.
    svc = make_service(TCTUNE_SIM_DELAY_S="0.06", TCTUNE_BATCH_SIZE="8",
                       TCTUNE_MEASURE_PROCESSES=measure_processes).start()
    job_id = httpx.post(f"{svc.url}/tune", json={"shape": STAGE2, "precision": "int8",
                                                 "target": "h200", "trials": 64},
                        headers=svc.headers).json()["job_id"]
    before = _wait(svc.url, job_id, lambda s: s["trials_done"] >= 12)
    svc.kill()
    assert before["status"] == "running"
    with session_scope(svc.db_url) as s:
        done_at_kill = s.scalar(select(func.count(Measurement.id)))
    assert 12 <= done_at_kill < 64

    svc.start()
    state = _wait(svc.url, job_id, lambda s: s["status"] == "done")
    assert state["trials_done"] == 64
    with session_scope(svc.db_url) as s:
        rows = s.execute(select(Measurement.schedule_hash).where(Measurement.job_id == job_id))
        hashes = [h for (h,) in rows]
    assert len(hashes) == 64, "the budget is measured exactly"
    assert len(set(hashes)) == 64, "no schedule measured twice"
    assert httpx.get(f"{svc.url}/schedule", params=QUERY).status_code == 200


def test_a_layer_over_two_inputs_tunes_within_its_rules(
        make_service: Callable[..., Service]) -> None:
    """A bottleneck's last conv and projection as one layer (shape.concat): the service's
    search proposes only schedules that layer can run (kernels.space.concat_problems), and
    GET /schedule serves its best by the same shape."""
    from kernels.space import concat_problems
    from kernels.spec import ConvShape, Precision, get_target

    shape = {"n": 8, "h": 56, "w": 56, "c": 384, "k": 512, "r": 1, "s": 1, "stride": 2,
             "concat": 128}
    svc = make_service().start()
    resp = httpx.post(f"{svc.url}/tune", json={"shape": shape, "precision": "fp16",
                                               "target": "h100", "trials": 32},
                      headers=svc.headers)
    assert resp.status_code == 202, resp.text
    state = _wait(svc.url, resp.json()["job_id"], lambda s: s["status"] == "done")
    assert state["trials_done"] == 32
    layer = ConvShape.from_dict(shape)
    sm = get_target("h100").sm
    for m in state["measurements"]:
        assert concat_problems(layer, Precision.FP16, sm, m["schedule"]) is None, m["schedule"]
    got = httpx.get(f"{svc.url}/schedule", params={**shape, "stride": 2, "precision": "fp16",
                                                   "target": "h100"})
    assert got.status_code == 200, got.text
    assert got.json()["task_key"].startswith(layer.key() + "|")


def test_explorer_processes_propose_each_job_on_one_of_them(
        make_service: Callable[..., Service]) -> None:
    # Two explorer processes: each job's rounds are proposed by one of them (job id modulo
    # two), none twice, and every job ends with its budget of distinct schedules.
    import sqlalchemy as sa

    svc = make_service(TCTUNE_EXPLORE_PROCESSES="2").start()
    shapes = [STAGE2, {**STAGE2, "h": 28, "w": 28, "c": 128, "k": 128},
              {**STAGE2, "h": 14, "w": 14, "c": 256, "k": 256}]
    ids = []
    for shape in shapes:
        resp = httpx.post(f"{svc.url}/tune", json={"shape": shape, "precision": "int8",
                                                   "target": "h200", "trials": 40},
                          headers=svc.headers)
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["job_id"])
    for job_id in ids:
        state = _wait(svc.url, job_id, lambda s: s["status"] == "done")
        history = state["measurements"]
        assert [m["trial"] for m in history] == list(range(1, 41))
        assert len({m["schedule_hash"] for m in history}) == 40
    time.sleep(3)  # the explorers write their counts at most every 2 s
    with sa.create_engine(svc.db_url).connect() as c:
        rows = c.execute(sa.text("SELECT name, proposals FROM explorer_stat")).all()
    assert svc.proc is not None
    explorers = [r for r in rows if r[1] > 0]
    # proposals came from two processes, neither of them the API's
    assert len(explorers) == 2, rows
    assert all(not r[0].endswith(f":{svc.proc.pid}") for r in explorers), rows


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (the service's pool children)."""
    return [child for child, _, f in proc_stats() if int(f[1]) == pid and f[0] != "Z"]


@pytest.mark.guarantee
def test_jobs_survive_sigkill_of_every_pool_child(make_service: Callable[..., Service]) -> None:
    """Builders, measuring processes and explorer processes killed mid-job (the out-of-memory
    killer's way) are replaced: no job fails, every budget is measured exactly, nothing twice."""
    svc = make_service(TCTUNE_SIM_DELAY_S="0.03", TCTUNE_BATCH_SIZE="8",
                       TCTUNE_EXPLORE_PROCESSES="2", TCTUNE_MEASURE_PROCESSES="2").start()
    assert svc.proc is not None
    shapes = [STAGE2, {**STAGE2, "h": 28, "w": 28, "c": 128, "k": 128}]
    ids = [httpx.post(f"{svc.url}/tune", json={"shape": shape, "precision": "int8",
                                               "target": "h200", "trials": 48},
                      headers=svc.headers).json()["job_id"] for shape in shapes]
    killed = 0
    for at in (8, 24):  # twice: the second time the replacements die too
        _wait(svc.url, ids[0], lambda s, at=at: s["trials_done"] >= at)
        for pid in _children(svc.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it exited between the listing and the kill
                continue
            killed += 1
    assert killed >= 2 * 4  # build, 2 measuring and 2 explorer processes each time
    for job_id in ids:
        state = _wait(svc.url, job_id, lambda s: s["status"] != "running", timeout=240)
        assert state["status"] == "done", state.get("error")
        trials = [m["trial"] for m in state["measurements"]]
        assert trials == list(range(1, 49))
        assert len({m["schedule_hash"] for m in state["measurements"]}) == 48
