"""A pool child of the embedded service does not outlive the service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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
