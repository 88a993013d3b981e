"""Hostile and careless requests against a running service: no answer may be a 5xx.

Starts `tctune serve` (embedded, simulated GPUs) on SQLite and on a fresh PostgreSQL
database, seeds it with a few finished jobs, creates a `tune` token, and sends --requests
requests per database from --threads threads. Each request starts from a valid one of some
endpoint and is then mutated (derandomized: --seed): JSON leaves replaced by NaN, Infinity,
1e400, NUL bytes, non-ASCII digits, huge integers, deep nesting; bodies truncated or made
not UTF-8; query values replaced the same way (percent-encoded NUL bytes included); unknown
and repeated parameters; odd path ids; odd Last-Event-ID and Authorization headers. Every
request carries the tune token (or a wrong or missing one), except half of the admin-only
ones (POST /import, DELETE /tasks), which carry the admin token so that their validation
runs too.

Every answer's status is counted per endpoint; any 5xx (or a dropped connection) is kept
with its request. Writes bench/data/fuzz_api_<db>.json and prints one line per database.

    python bench/fuzz_api.py [--db sqlite postgresql] [--requests 10000] [--threads 4]
        [--seed 22] [--out-dir bench/data]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._procs import (  # noqa: E402
    create_database,
    drop_database,
    free_port,
    start,
    stop,
    wait_http,
)

SHAPE = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3,
         "stride": [1, 1], "pad": [1, 1], "dilation": [1, 1]}
# The layer of the first seeded job (found: 200), unless mutated.
LAYER_QUERY = {"n": "8", "h": "56", "w": "56", "c": "64", "k": "8", "r": "3", "s": "3",
               "pad": "1", "precision": "int8", "target": "h200"}

# Values a careless or hostile client puts where a number or a name belongs. Raw JSON text
# (NaN, Infinity and 1e400 cannot be written by json.dumps).
JSON_POISON = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e308", "-0", "0",
               "-1", "2147483648", "99999999999999999999999999", "1.5", "true", "null",
               '""', '"\\u0000"', '"a\\u0000b"', '"\\u00b2"', '"\\u0661"', '"8"', '"H200"',
               '"INT8"', "[]", "{}", '"' + "x" * 5000 + '"', "[" * 60 + "]" * 60,
               "[" * 5000 + "]" * 5000, '{"a":' * 300 + "1" + "}" * 300]
QUERY_POISON = ["%00", "a%00b", "NaN", "nan", "inf", "Infinity", "1e400", "-1", "0",
                "99999999999999999999", "", "%C2%B2", "%D9%A1", "%FF", "%E2%80%AE", "H200",
                "INT8", "Running", "x" * 3000, "1,2,3", "1%2C%00", "%20%20", "..%2F..", "%"]
PATH_IDS = ["0", "-1", "1", "2", "3", "2147483648", "9223372036854775808", "abc", "%00",
            "%C2%B2", "1.5", "1e3", "%20", "x" * 300]


@dataclass
class Req:
    endpoint: str
    method: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)  # already percent-encoded
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    admin: bool = False  # sent with the admin token (half of the admin-only requests)


def _json_body(rng: random.Random, value: Any) -> bytes:
    """`value` as JSON with 0-3 of its leaves (or the whole) replaced by poison."""
    text_ = json.dumps(value)
    leaves = _leaf_spans(text_)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        if not leaves:
            break
        lo, hi = rng.choice(leaves)
        poison = rng.choice(JSON_POISON)
        text_ = text_[:lo] + poison + text_[hi:]
        leaves = _leaf_spans(text_) if len(text_) < 200_000 else []
    raw = text_.encode()
    roll = rng.random()
    if roll < 0.05:
        raw = raw[: rng.randrange(len(raw) + 1)]  # truncated
    elif roll < 0.08:
        pos = rng.randrange(len(raw) + 1)
        raw = raw[:pos] + rng.choice([b"\x00", b"\xff", b"\xc3", b"\\u0000"]) + raw[pos:]
    elif roll < 0.10:
        raw = rng.choice([b"", b"null", b"[]", b"42", b"\"x\"", b"{", b"NaN"])
    return raw


def _leaf_spans(text_: str) -> list[tuple[int, int]]:
    """(start, end) of every number and string value in a JSON text made by json.dumps."""
    spans, i, n = [], 0, len(text_)
    while i < n:
        ch = text_[i]
        if ch == '"':
            j = i + 1
            while j < n and text_[j] != '"':
                j += 2 if text_[j] == "\\" else 1
            if j + 1 < n and text_[j + 1] == ":":  # a key, not a value
                i = j + 1
                continue
            spans.append((i, j + 1))
            i = j + 1
        elif ch in "-0123456789":
            j = i
            while j < n and text_[j] in "-+.eE0123456789":
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def _query(rng: random.Random, base: dict[str, str]) -> list[tuple[str, str]]:
    items = [(k, quote(v, safe=",")) for k, v in base.items()]
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        roll = rng.random()
        if roll < 0.6 and items:
            i = rng.randrange(len(items))
            items[i] = (items[i][0], rng.choice(QUERY_POISON))
        elif roll < 0.75 and items:
            items.pop(rng.randrange(len(items)))
        elif roll < 0.9:
            items.append((rng.choice(["x", "status", "state", "limit", "token", "%00",
                                      "target", "after", "format"]), rng.choice(QUERY_POISON)))
        elif items:
            items.append(rng.choice(items))  # repeated
    return items


def make_request(rng: random.Random, job_ids: list[int]) -> Req:
    """One request: a valid one of a random endpoint, mutated."""
    some_id = str(rng.choice(job_ids)) if job_ids and rng.random() < 0.6 else \
        rng.choice(PATH_IDS)
    layer = {"shape": dict(SHAPE), "precision": rng.choice(["int8", "fp16", "int4", "fp32_tc"]),
             "target": rng.choice(["h200", "h100", "a100", "t4", "l4", "a10"])}
    kind = rng.choice(["tune", "tune", "lookup", "lookup", "schedule", "schedule", "schedules",
                       "export", "jobs", "job", "events", "cancel", "import", "delete",
                       "workers", "health", "metrics", "pages", "static", "docs"])
    if kind == "tune":
        body = {**layer, "trials": rng.choice([4, 8, 16]), "seed": rng.randrange(1000)}
        body["shape"]["k"] = rng.choice([8, 16, 32, 64, 128])
        return Req("POST /tune", "POST", "/tune", body=_json_body(rng, body),
                   headers={"content-type": "application/json"})
    if kind == "lookup":
        return Req("POST /schedules/lookup", "POST", "/schedules/lookup",
                   body=_json_body(rng, {"layers": [layer] * rng.randint(1, 3)}),
                   headers={"content-type": "application/json"})
    if kind == "schedule":
        return Req("GET /schedule", "GET", "/schedule", _query(rng, dict(LAYER_QUERY)))
    if kind in ("schedules", "export"):
        base = {"target": "h200", "precision": "int8"}
        if kind == "schedules" and rng.random() < 0.5:
            base["format"] = "jsonl"
        return Req(f"GET /{kind}", "GET", f"/{kind}", _query(rng, base))
    if kind == "jobs":
        return Req("GET /jobs", "GET", "/jobs", _query(rng, {"status": "done", "limit": "10"}))
    if kind == "job":
        return Req("GET /jobs/{id}", "GET", f"/jobs/{some_id}", _query(rng, {"after": "0"}))
    if kind == "events":
        raw = [(b"last-event-id", rng.choice([b"1", b"\xb2", "١".encode(), b"-1", b"1e3",
                                              b"99999999999", b"0003", b"abc"]))]
        return Req("GET /jobs/{id}/events", "GET", f"/jobs/{some_id}/events",
                   _query(rng, {"interval": "0.05"}), raw_headers=raw)
    if kind == "cancel":
        return Req("POST /jobs/{id}/cancel", "POST", f"/jobs/{some_id}/cancel")
    if kind == "delete":
        return Req("DELETE /tasks/{id}", "DELETE", f"/tasks/{some_id}",
                   admin=rng.random() < 0.2)
    if kind == "import":
        line = {"kind": "measurement", "task": layer, "schedule": {"BLK_ROW_WARPS": 2},
                "status": "ok", "median_us": 5.0, "backend": "simulated",
                "measured_at": "9999-12-31T23:00:00-05:00"}
        return Req("POST /import", "POST", "/import", body=_json_body(rng, line) + b"\n",
                   headers={"content-type": "application/x-ndjson"}, admin=rng.random() < 0.5)
    if kind == "pages":
        path = rng.choice(["/", "/ui", "/ui/fleet", "/ui/schedules", f"/ui/jobs/{some_id}"])
        return Req("GET pages", "GET", path, _query(rng, {}))
    if kind == "static":
        name = rng.choice(["dashboard.js", "plotly.min.js", "%00", "a%00.js", "x" * 5000,
                           "..%2F..%2Fapi%2Fapp.py", "%C2%B2.js", "dashboard.css%00"])
        return Req("GET /ui/static/{name}", "GET", f"/ui/static/{name}")
    if kind == "docs":
        return Req("GET docs", "GET", rng.choice(["/docs", "/redoc", "/openapi.json",
                                                  "/docs/assets/swagger-ui.css",
                                                  "/docs/assets/%00"]))
    name = {"workers": "/workers", "health": "/healthz", "metrics": "/metrics"}[kind]
    return Req(f"GET {name}", "GET", name, _query(rng, {}))


def _authorize(rng: random.Random, req: Req, token: str, admin: str) -> None:
    if req.admin:
        req.headers["Authorization"] = f"Bearer {admin}"
        return
    roll = rng.random()
    if roll < 0.8:
        req.headers["Authorization"] = f"Bearer {token}"
    elif roll < 0.85:
        req.query.append(("token", token))  # mutations refuse this
    elif roll < 0.9:
        req.headers["Authorization"] = rng.choice(["Bearer", "Bearer tct_wrong", "Basic x",
                                                   f"bearer  {token}"])
    # else: no token at all


def send(client: httpx.Client, req: Req) -> int:
    """The status, or -1 when the connection broke (counted as a server error)."""
    url = req.path + ("?" + "&".join(f"{k}={v}" for k, v in req.query) if req.query else "")
    headers = [(k.encode(), v.encode()) for k, v in req.headers.items()] + req.raw_headers
    try:
        with client.stream(req.method, url, content=req.body, headers=headers) as resp:
            for _ in resp.iter_raw():  # read to the end (event streams close by deadline)
                pass
            return resp.status_code
    except httpx.LocalProtocolError:
        return 0  # a header value HTTP itself forbids (h11 refuses it): counted, not sent
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout,
            httpx.ConnectError, httpx.WriteError):
        return -1


def seed_jobs(url: str, token: str) -> list[int]:
    """A few jobs that end quickly, so that ids point at real rows with measurements."""
    ids = []
    for k in (8, 16, 24):
        resp = httpx.post(f"{url}/tune", headers={"Authorization": f"Bearer {token}"}, json={
            "shape": {**SHAPE, "k": k}, "precision": "int8", "target": "h200", "trials": 8})
        ids.append(resp.json()["job_id"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = [httpx.get(f"{url}/jobs/{i}").json()["status"] for i in ids]
        if all(s == "done" for s in states):
            break
        time.sleep(0.5)
    return ids


def run_one(db: str, n: int, threads: int, seed: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"fuzz-{db}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCTUNE_")}
    env.update(TCTUNE_BACKEND="simulated", TCTUNE_EVENTS_MAX_S="1",
               TCTUNE_ACTIVE_JOBS_PER_TOKEN="10", PYTHONUNBUFFERED="1")
    pg_url = None
    if db == "postgresql":
        pg_url = env["TCTUNE_DATABASE_URL"] = create_database("tctune_fuzz")
        from store import migrate

        migrate.upgrade(env["TCTUNE_DATABASE_URL"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "serve.log"
    proc = start([sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--data",
                  str(tmp / "data")], env, log)
    try:
        wait_http(f"{url}/healthz", proc, 90, log, what="tctune serve")
        token = _tune_token(env, tmp)
        admin = (tmp / "data" / "token").read_text().strip()  # printed at the first start
        job_ids = seed_jobs(url, admin)
        counts: dict[str, Counter[int]] = defaultdict(Counter)
        failures: list[dict[str, Any]] = []
        lock = threading.Lock()
        rngs = [random.Random(seed * 1000 + t) for t in range(threads)]

        def worker(t: int) -> None:
            rng = rngs[t]
            with httpx.Client(base_url=url, timeout=30) as client:
                for _ in range(t, n, threads):
                    req = make_request(rng, job_ids)
                    _authorize(rng, req, token, admin)
                    status = send(client, req)
                    with lock:
                        counts[req.endpoint][status] += 1
                        if status >= 500 or status < 0:
                            failures.append({"status": status, "method": req.method,
                                             "path": req.path, "query": req.query[:20],
                                             "body": (req.body or b"")[:500].decode(
                                                 "utf-8", "replace")})

        started = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        elapsed = time.monotonic() - started
    finally:
        stop(proc)
        if pg_url:
            from store.db import get_engine

            get_engine(pg_url).dispose()
            drop_database(pg_url)
    total = sum(v for c in counts.values() for s, v in c.items() if s != 0)
    server_errors = sum(v for c in counts.values() for s, v in c.items() if s >= 500 or s < 0)
    by_status: Counter[int] = Counter()
    for c in counts.values():
        by_status.update(c)
    return {"db": db, "requests": total, "not_sent": by_status.pop(0, 0),
            "server_errors": server_errors,
            "seconds": round(elapsed, 1), "req_per_s": round(total / elapsed, 1),
            "by_status": dict(sorted(by_status.items())),
            "by_endpoint": {k: dict(sorted(v.items())) for k, v in sorted(counts.items())},
            "failures": failures[:50], "seed": seed, "threads": threads}


def _tune_token(env: dict[str, str], tmp: Path) -> str:
    """A `tune` token made with the CLI, as an operator would."""
    import subprocess

    res = subprocess.run([sys.executable, "-m", "api.cli", "token", "create", "--scope",
                          "tune", "--name", "fuzz"], cwd=REPO, capture_output=True, text=True,
                         env={**env, "TCTUNE_DATA_DIR": str(tmp / "data")}, check=True)
    return res.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", nargs="+", default=["sqlite", "postgresql"])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "data")
    args = ap.parse_args(argv)
    worst = 0
    for db in args.db:
        row = run_one(db, args.requests, args.threads, args.seed)
        row.update(date=datetime.now(UTC).isoformat(timespec="seconds"),
                   machine=f"{platform.node()} ({os.cpu_count()} cores)",
                   command="python bench/fuzz_api.py " + " ".join(argv or sys.argv[1:]))
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / f"fuzz_api_{db}.json").write_text(json.dumps(row, indent=1) + "\n")
        print(f"{db}: {row['requests']} requests in {row['seconds']} s, "
              f"{row['server_errors']} server errors; statuses {row['by_status']}")
        worst = max(worst, row["server_errors"])
    return 1 if worst else 0

if __name__ == "__main__":
    sys.exit(main())
