"""A simulated node of several GPU slots (`tctune worker --simulate h200 --slots 4`) through
Celery, Redis and PostgreSQL: each slot is a worker of its own, its heartbeat says which
slots are measuring (learnt from Celery's success signal in the slot's thread), and the
job ends with exactly its budget measured once."""

from __future__ import annotations

import httpx

from tests.workers.test_fleet import Fleet, _until, fleet  # noqa: F401  (the fixture)


def test_the_slots_of_a_node_heartbeat_busy_while_they_measure(fleet: Fleet) -> None:  # noqa: F811
    fleet.start(workers=0)
    fleet.run("node", "worker", "--simulate", "h200", "--slots", "4",
              TCTUNE_SIM_DELAY_S="0.1")
    job_id = fleet.submit(64)
    seen: set[str] = set()

    def busy_slots() -> bool:
        seen.update(w["name"] for w in httpx.get(f"{fleet.url}/workers").json()
                    if w["state"] == "busy")
        return len(seen) >= 2

    _until(busy_slots, 120, fleet.logs)
    assert all("#" in name for name in seen), seen
    fleet.wait(job_id, lambda s: s["status"] == "done")
    fleet.assert_exact(job_id, 64)
    fleet.assert_measured_once()
