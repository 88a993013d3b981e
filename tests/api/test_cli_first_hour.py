"""The CLI for a new user: `tctune serve` says where it listens and how to point the CLI
at it, a service started with --data DIR is reached with --data DIR, and every failure is
one line on stderr, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, Service, free_port

SHAPE = ["--shape", "n=8,h=56,w=56,c=64,k=64,r=3,s=3,pad=1", "--precision", "int8",
         "--target", "h200"]


def cli(*args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TCTUNE_")}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO,
                          env={**base, **env}, capture_output=True, text=True, timeout=120)


def assert_one_line(res: subprocess.CompletedProcess[str], *words: str) -> None:
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("args", [["token", "list"], ["token", "create", "--scope", "read"],
                                  ["token", "revoke", "3"], ["db", "upgrade"]])
def test_database_commands_without_a_database_fail_in_one_line(args: list[str]) -> None:
    res = cli(*args, TCTUNE_DATABASE_URL="postgresql+psycopg://me:secret@127.0.0.1:1/x")
    assert_one_line(res, "cannot use the database", "127.0.0.1:1", "TCTUNE_DATABASE_URL")
    assert "secret" not in res.stderr


@pytest.mark.parametrize("args", [["schedule", *SHAPE], ["tune", *SHAPE],
                                  ["export", "--out", "-"]])
def test_client_commands_without_a_service_fail_in_one_line(args: list[str],
                                                            tmp_path: Path) -> None:
    port = free_port()
    res = cli(*args, "--server", f"http://127.0.0.1:{port}", TCTUNE_DATA_DIR=str(tmp_path))
    assert_one_line(res, f"http://127.0.0.1:{port}", "TCTUNE_SERVER")


def test_serve_says_where_it_listens_and_the_cli_finds_it_by_data_dir(
        make_service: Callable[..., Service], tmp_path: Path) -> None:
    svc = make_service().start()
    log = svc.log_path.read_text()  # type: ignore[union-attr]
    assert f"listening on {svc.url}" in log and f"{svc.url}/docs" in log
    assert f"TCTUNE_SERVER={svc.url}" in log
    assert f"TCTUNE_TOKEN=$(cat {(svc.data_dir / 'token').resolve()})" in log
    # Elsewhere (no ./tctune-data): without a token the error says how to give one...
    elsewhere = {"TCTUNE_DATA_DIR": str(tmp_path / "nothing-here")}
    res = cli("tune", *SHAPE, "--trials", "4", "--server", svc.url, **elsewhere)
    assert_one_line(res, "a bearer token is required", "--data DIR", "--token")
    # ...and --data DIR of the service is enough.
    res = cli("tune", *SHAPE, "--trials", "4", "--server", svc.url, "--data", str(svc.data_dir))
    assert res.returncode == 0, res.stderr
    assert "queued" in res.stderr or "job" in res.stderr


def test_a_layer_without_a_schedule_says_so_in_one_line(
        make_service: Callable[..., Service]) -> None:
    svc = make_service().start()
    res = cli("schedule", *SHAPE, "--server", svc.url, "--data", str(svc.data_dir))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip() == "no verified schedule yet", res.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--threads", "2"], ["--threads needs PostgreSQL", "TCTUNE_DATABASE_URL"]),
    (["--threads", "2", "--procs", "2"], ["--procs and --threads"]),
])
def test_explorer_threads_refused_where_they_cannot_run(args: list[str], words: list[str],
                                                        tmp_path: Path) -> None:
    # SQLite has no row lock to keep two threads off one job.
    res = cli("explorer", *args, TCTUNE_BROKER_URL="redis://127.0.0.1:1/0",
              TCTUNE_DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert_one_line(res, *words)
