"""A pool child of the embedded service does not outlive the service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from store.settings import Settings

REPO = Path(__file__).resolve().parents[2]

SERVICE = textwrap.dedent("""
    import multiprocessing as mp, os, time
    from concurrent.futures import ProcessPoolExecutor
    from store.settings import Settings
    from workers.local import _init_child
    if __name__ == "__main__":
        # As the dispatcher makes its pools (workers.local.LocalTransport._pool).
        pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"),
                                   initializer=_init_child,
                                   initargs=(Settings().model_dump_json(), os.getpid()))
        print(pool.submit(os.getpid).result(), flush=True)
        time.sleep(120)
""")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it has exited)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state


def test_pool_children_exit_when_the_service_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TCTUNE_DATA_DIR": str(tmp_path)}
    service = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, text=True)
    try:
        child = int(service.stdout.readline())  # type: ignore[union-attr]
        assert _alive(child)
        service.send_signal(signal.SIGKILL)  # no shutdown of the pool: the child is orphaned
        service.wait(10)
        # The child checks every PARENT_CHECK_S (1 s); the deadline only bounds a failure,
        # generous for a loaded machine.
        deadline = time.monotonic() + 60
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), f"the pool child {child} outlived the service by 60 s"
    finally:
        service.kill()


def test_each_measuring_process_owns_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """One measuring process per local GPU of the target's model (or as many as asked, taking
    the GPUs in turn), each started with CUDA_VISIBLE_DEVICES naming its own GPU, so that
    no two time candidates side by side on one GPU."""
    from workers import local
    from workers.local import LocalTransport, measure_gpus
    from workers.protocol import Rounds

    monkeypatch.setattr(local, "local_gpus", lambda: [0, 1])
    assert measure_gpus(Settings(backend="cuda")) == ["0", "1"]
    assert measure_gpus(Settings(backend="cuda", measure_processes=3)) == ["0", "1", "0"]
    assert measure_gpus(Settings(backend="simulated")) == [None]
    assert measure_gpus(Settings(backend="simulated", measure_processes=2)) == [None, None]
    monkeypatch.setattr(local, "local_gpus", lambda: [])
    assert measure_gpus(Settings(backend="auto")) == [None]

    monkeypatch.setattr(local, "local_gpus", lambda: [2, 5])
    settings = Settings(backend="cuda")
    transport = LocalTransport(settings, Rounds.embedded(settings))
    try:
        assert transport.measure_gpus() == ["2", "5"]
        seen = [transport._pool(f"measure{i}").submit(os.getenv, "CUDA_VISIBLE_DEVICES")
                .result(timeout=120) for i in range(2)]
        assert seen == ["2", "5"]
        # a build process sees every GPU (it builds, never touches one)
        assert transport._pool("build").submit(os.getenv, "CUDA_VISIBLE_DEVICES") \
            .result(timeout=120) == os.getenv("CUDA_VISIBLE_DEVICES")
    finally:
        transport.stop()


def test_candidates_go_to_the_measuring_process_with_the_fewest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import Future

    from workers.local import LocalTransport
    from workers.protocol import Rounds

    settings = Settings(backend="simulated", measure_processes=2)
    transport = LocalTransport(settings, Rounds.embedded(settings))
    sent: dict[int, tuple[str, Future[object]]] = {}

    def submit_to(pool: str, fn: object, cid: int, target: str) -> Future[object]:
        sent[cid] = (pool, Future())
        return sent[cid][1]

    monkeypatch.setattr(transport, "_submit_to", submit_to)
    transport._job_of.update({c: 7 for c in range(1, 6)})
    transport.send_measure("h200", [1, 2, 3])
    assert [sent[c][0] for c in (1, 2, 3)] == ["measure0", "measure1", "measure0"]
    sent[1][1].set_result(set())
    sent[3][1].set_result(set())
    assert {d.candidate_ids[0] for d in transport.collect(1.0)} == {1, 3}
    transport.send_measure("h200", [4, 5])  # measure1 still holds candidate 2
    assert [sent[c][0] for c in (4, 5)] == ["measure0", "measure0"]


def test_the_measuring_processes_start_with_the_service() -> None:
    """Each measuring process (and on a GPU its measuring child and CUDA context, over 10 s
    on an H200 host) starts when the dispatcher does, before any job."""
    from workers.local import LocalTransport
    from workers.protocol import Rounds

    settings = Settings(backend="simulated", measure_processes=2)
    transport = LocalTransport(settings, Rounds.embedded(settings))
    try:
        futures = transport.warm()
        assert [f.result(timeout=120) for f in futures] == ["the analytical model"] * 2
        assert sorted(transport._pools) == ["measure0", "measure1"]
        assert transport.quiet()  # nothing of a job's on its way
    finally:
        transport.stop()
