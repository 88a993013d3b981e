"""Child processes for the benchmarks and the tests' fixtures: a free port, a logged child in
a process group of its own, waiting for its /healthz, stopping the whole group.

Standard library and httpx only (SQLAlchemy for a scratch PostgreSQL database, imported
there), and nothing of the project: the benchmarks in bench/ and tests/conftest.py both
import it (tests may use bench/, never the other way round).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
# Where scratch databases are made (trust auth on the local server, as in CI).
PG_ADMIN_URL = os.environ.get("TCTUNE_TEST_PG",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(argv: Sequence[str], env: Mapping[str, str], log: Path,
          cwd: Path = REPO) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (so that its whole process group can be signalled),
    stdout and stderr written to `log`."""
    fh = open(log, "wb")  # noqa: SIM115 (the child keeps it)
    try:
        return subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        fh.close()  # the child has its own descriptor


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 60.0,
              log: Path | None = None, interval: float = 0.2, what: str = "server") -> None:
    """Poll `url` until it answers 200. RuntimeError (with the log's text) when `proc`
    exits first or `timeout` seconds pass."""
    def tail() -> str:
        return log.read_text(errors="replace")[-4000:] if log and log.exists() else ""

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}): {tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up in {timeout:.0f} s: {tail()}")
        time.sleep(interval)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The group too when its leader has exited: its children may live on.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def kill(proc: subprocess.Popen[bytes], wait_s: float = 10.0) -> None:
    """SIGKILL the process group that `proc` leads (start()'s children lead one)."""
    _signal_group(proc, signal.SIGKILL)
    proc.wait(wait_s)


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM the process group, SIGKILL it if it is still there after `timeout` s."""
    stop_all([proc], timeout)


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 20.0) -> None:
    """SIGTERM every group at once, then wait for each (SIGKILL past the deadline)."""
    procs = list(procs)
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill(p)


def proc_stats() -> Iterator[tuple[int, str, list[str]]]:
    """Every process of the machine now: (pid, command name, the fields of /proc/PID/stat
    after the name: state, ppid, process group, ..., utime at 11, stime at 12, cutime and
    cstime at 13 and 14); one that exits while it is read is left out."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text_ = stat.read_text()
        except OSError:
            continue
        head, rest = text_.rsplit(")", 1)
        yield int(stat.parent.name), head.split("(", 1)[1], rest.split()


def comm_cpu_s(name: str) -> float:
    """CPU seconds (user + system) of every process of the machine named `name`, from /proc."""
    return sum(int(f[11]) + int(f[12]) for _, comm, f in proc_stats() if comm == name) / TICK


def _admin_execute(admin_url: str, sql: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(sql))
    finally:
        admin.dispose()


def create_database(prefix: str, admin_url: str = PG_ADMIN_URL) -> str:
    """A fresh, empty PostgreSQL database named `prefix` and a random suffix: its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    _admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def drop_database(url: str, admin_url: str = PG_ADMIN_URL) -> None:
    """Drop a database of `create_database`, its connections closed by the server."""
    _admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_database(prefix: str, admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """`create_database`'s URL, dropped on the way out."""
    url = create_database(prefix, admin_url)
    try:
        yield url
    finally:
        drop_database(url, admin_url)
