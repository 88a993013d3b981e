"""Mutation check of the guarantee tests: break each guarantee on purpose, in a temporary
copy of the repository, and see whether `pytest -m guarantee` notices.

Each mutant is one or more exact text replacements (each must match exactly once, so a
mutant that no longer applies is reported, not silently skipped). The unmutated copy runs
first and must pass. A mutant is `killed` when the guarantee tests fail under it,
`survived` when they pass; `expected` says which mutants are known to be equivalent (the
behaviour they change is unobservable because another layer holds the guarantee too).

    python3 bench/mutation_check.py [--only NAME ...] [--out bench/data/mutation_check.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# In-process tests first, the multi-process fleet last: with -x a killed mutant stops at
# its first failure, and most are caught before the slow tests start.
TEST_FILES = [*(f"tests/guarantees/test_guarantee_{n}.py"
                for n in ("check", "serving", "delivery", "migrations", "import_tokens")),
              "tests/api/test_auth_limits.py", "tests/api/test_shared_limits.py",
              "tests/test_e2e_embedded.py", "tests/workers/test_fleet.py"]


@dataclass
class Mutant:
    name: str
    what: str
    edits: list[tuple[str, str, str]]  # (path, old text, new text)
    expected: str = "killed"  # or "equivalent: why"
    result: dict[str, object] = field(default_factory=dict)


MUTANTS = [
    Mutant("embedded-explorer-death-fails-job",
           "a proposal whose explorer process died fails its job",
           [("workers/embedded.py", "        elif isinstance(exc, BrokenProcessPool):\n",
             "        elif False:\n")]),
    Mutant("check-int-accepts-anything",
           "the reference check accepts any int8/int4 output",
           [("kernels/reference.py", "return bad == 0, {\"mismatches\"",
             "return True, {\"mismatches\"")]),
    Mutant("check-fp16-accepts-anything",
           "the reference check accepts any finite fp16 output",
           [("kernels/reference.py",
             "return rel <= FP16_REL_TOL and worst <= FP16_ELEM_TOL, {",
             "return True, {")]),
    Mutant("time-without-check",
           "check_then_time times and stores a latency whatever the check said",
           [("kernels/runner.py", "    if not ok:\n        return {\"status\": \"wrong\"",
             "    if False:\n        return {\"status\": \"wrong\"")]),
    Mutant("best-filter-hotpath-sqlite",
           "the hot path's best recompute (SQLite) takes any status",
           [("store/hotpath.py",
             ".where(M.task_id == bindparam(\"task_id\"), M.status == \"ok\",",
             ".where(M.task_id == bindparam(\"task_id\"),")]),
    Mutant("best-filter-hotpath-postgresql",
           "the hot path's best of the rows just written (PostgreSQL) takes any status",
           [("store/hotpath.py", "\" WHERE m.status = 'ok' AND m.median_us IS NOT NULL\"",
             "\" WHERE m.median_us IS NOT NULL\"")]),
    Mutant("best-filter-task-write",
           "the task write hands every row with a latency to the best refresh",
           [("workers/tasks.py", "if o.status == \"ok\" and o.median_us is not None",
             "if o.median_us is not None")],
           expected="equivalent: the best refresh it feeds filters status = 'ok' itself on "
                    "both databases (best-filter-hotpath-*), so no row it lets through can "
                    "become best; best-filter-write-path drops both and is killed"),
    Mutant("best-filter-write-path",
           "the task write and PostgreSQL's best refresh both take any status",
           [("workers/tasks.py", "if o.status == \"ok\" and o.median_us is not None",
             "if o.median_us is not None"),
            ("store/hotpath.py", "\" WHERE m.status = 'ok' AND m.median_us IS NOT NULL\"",
             "\" WHERE m.median_us IS NOT NULL\"")]),
    Mutant("runners-up-filter",
           "POST /schedules/lookup's runners-up take any status",
           [("store/repository.py", "Measurement.id != best.id,\n                "
             "Measurement.status == \"ok\", ", "Measurement.id != best.id,\n                ")]),
    Mutant("lease-never-expires",
           "a lease is never taken over once it expired (both databases)",
           [("store/hotpath.py",
             "\" AND (lease_expires_at IS NULL OR lease_expires_at < :now "
             "OR lease_owner = :owner)\"",
             "\" AND (lease_expires_at IS NULL OR lease_owner = :owner)\""),
            ("store/hotpath.py",
             "C.lease_expires_at.is_(None) | (C.lease_expires_at < now)\n",
             "C.lease_expires_at.is_(None)\n")]),
    Mutant("lease-ignored",
           "any worker takes a candidate another one holds (both databases)",
           [("store/hotpath.py", "OR lease_owner = :owner)\"",
             "OR lease_owner = :owner OR true)\""),
            ("store/hotpath.py", "| (C.lease_owner == owner))",
             "| (C.lease_owner == owner) | True)")]),
    Mutant("lease-not-renewed",
           "a worker whose chunk outlasts its lease does not renew it (another takes it)",
           [("store/hotpath.py",
             ".values(lease_expires_at=utcnow() + timedelta(seconds=seconds))",
             ".values(lease_expires_at=C.lease_expires_at)")]),
    Mutant("lost-lease-still-measured",
           "a worker measures the rest of its chunk after another worker took it over",
           [("workers/tasks.py",
             "            if item.cand_id not in held:\n                continue\n", "")]),
    Mutant("measured-schedule-leased-again",
           "a schedule already measured for the task is leased and measured again",
           [("store/hotpath.py", "(j.status = ANY(:active) AND NOT EXISTS (",
             "(j.status = ANY(:active) OR NOT EXISTS ("),
            ("store/hotpath.py", "if r.status not in ACTIVE_JOB_STATES or r.measured]",
             "if r.status not in ACTIVE_JOB_STATES]")]),
    Mutant("sweeper-lease-never-expires",
           "the sweeper treats an expired lease as live: a crashed worker's candidates "
           "are never re-sent",
           [("store/repository.py",
             "(Candidate.lease_expires_at.is_(None)) | (Candidate.lease_expires_at < now))",
             "(Candidate.lease_expires_at.is_(None)))")]),
    Mutant("sweeper-ignores-queue-depth",
           "the sweeper re-sends candidates whose message still waits in its queue",
           [("workers/queues.py", "return [c for c in stale if depth.get(",
             "return [c for c in stale if True or depth.get(")]),
    Mutant("resend-count-off-by-one",
           "the sweeper's count of re-sent candidates is one short",
           [("workers/protocol.py", "return Swept(len(due), len(lost), freed)",
             "return Swept(len(due), len(lost) - 1, freed)")]),
    Mutant("give-up-off-by-one",
           "a candidate is given up one attempt late",
           [("workers/tasks.py", "if row.attempts >= MAX_ATTEMPTS:",
             "if row.attempts > MAX_ATTEMPTS:")]),
    Mutant("migration-drops-column-data",
           "migration 0004 re-creates job.error (drop and add) instead of keeping it",
           [("migrations/versions/0004_api_tokens.py",
             "        batch_op.add_column(sa.Column(\"submitted_by\", sa.Integer(), "
             "nullable=True))\n",
             "        batch_op.add_column(sa.Column(\"submitted_by\", sa.Integer(), "
             "nullable=True))\n        batch_op.drop_column(\"error\")\n"
             "        batch_op.add_column(sa.Column(\"error\", sa.Text(), nullable=True))\n")]),
    Mutant("import-not-atomic",
           "import writes the valid lines of a file with a bad one, and the route commits",
           [("store/transfer.py", "    if errors:\n        return report\n", ""),
            ("api/routes/transfer.py", "raise _Invalid(report)  # rolls the transaction back",
             "pass")]),
    Mutant("import-not-idempotent",
           "a line already present is not recognised: the re-import makes an import job and "
           "counts the line as imported",
           [("store/transfer.py",
             "Measurement.task_id == task.id, Measurement.schedule_hash == digest)):",
             "Measurement.task_id == task.id, Measurement.schedule_hash == digest + '?')):"),
            ("store/transfer.py", "if session.execute(stmt).scalar() is not None:",
             "if session.execute(stmt) is not None:")]),
    Mutant("revoked-token-accepted",
           "a revoked token is still found",
           [("store/repository.py",
             "ApiToken.token_hash == token_digest(token), ApiToken.revoked_at.is_(None))",
             "ApiToken.token_hash == token_digest(token))")]),
    Mutant("token-cache-never-stale",
           "a token's cached lookup never expires (a revoked token works for ever)",
           [("api/auth.py", "if hit and now - hit[0] < TOKEN_CACHE_S:", "if hit:")]),
    Mutant("scope-not-checked",
           "every token has every scope",
           [("api/auth.py", "return SCOPES.index(self.scope) >= SCOPES.index(scope)",
             "return True")]),
]


def copy_repo(dest: Path) -> None:
    """Tracked and untracked (not ignored) files, as the working tree has them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def apply(root: Path, mutant: Mutant) -> None:
    for path, old, new in mutant.edits:
        p = root / path
        text = p.read_text()
        n = text.count(old)
        if n != 1:
            raise ValueError(f"{mutant.name}: {path} has {n} matches of {old!r}")
        p.write_text(text.replace(old, new))


def run_tests(root: Path, timeout: float) -> tuple[int, float, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCTUNE_")}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "guarantee", "-x", "-q", "-rfE", "-p",
             "no:cacheprovider", *TEST_FILES], cwd=root, env=env, capture_output=True,
            text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"timed out after {timeout} s\n{e.stdout or ''}"
    return rc, round(time.monotonic() - t0, 1), out


def first_failure(out: str) -> str:
    for line in out.splitlines():
        if line.startswith("FAILED") or line.startswith("ERROR"):
            return line[:240]
    return out.strip().splitlines()[-1][:240] if out.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="mutant names (default: all)")
    ap.add_argument("--out", default=str(REPO / "bench" / "data" / "mutation_check.json"))
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--skip-baseline", action="store_true")
    a = ap.parse_args()
    chosen = [m for m in MUTANTS if not a.only or m.name in a.only]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    report: dict[str, object] = {"command": " ".join(["python3", *sys.argv]),
                                 "commit": commit, "tests": TEST_FILES, "mutants": []}
    with tempfile.TemporaryDirectory(prefix="tctune-mut-") as tmp:
        if not a.skip_baseline:
            base = Path(tmp) / "baseline"
            copy_repo(base)
            rc, secs, out = run_tests(base, a.timeout)
            report["baseline"] = {"rc": rc, "seconds": secs, "tail": out[-1500:]}
            print(f"baseline: rc={rc} in {secs} s", flush=True)
            if rc != 0:
                print(out[-4000:])
                print("the unmutated guarantee tests fail: no mutant result means anything")
                _write(a.out, report)
                return 2
        for m in chosen:
            root = Path(tmp) / m.name
            copy_repo(root)
            try:
                apply(root, m)
            except ValueError as e:
                m.result = {"outcome": "not applied", "why": str(e)}
            else:
                rc, secs, out = run_tests(root, a.timeout)
                m.result = {"outcome": "killed" if rc != 0 else "survived", "rc": rc,
                            "seconds": secs, "by": first_failure(out) if rc else "",
                            "tail": out[-1200:]}
            shutil.rmtree(root, ignore_errors=True)
            report["mutants"].append({"name": m.name, "what": m.what,  # type: ignore[union-attr]
                                      "expected": m.expected, **m.result})
            print(f"{m.name}: {m.result['outcome']} ({m.result.get('seconds', '-')} s) "
                  f"{m.result.get('by', m.result.get('why', ''))}", flush=True)
            _write(a.out, report)
    _write(a.out, report)
    bad = [m.name for m in chosen if m.result.get("outcome") != "killed"
           and not m.expected.startswith("equivalent")]
    print(f"{sum(m.result.get('outcome') == 'killed' for m in chosen)} of {len(chosen)} "
          f"killed; unexplained: {bad or 'none'}")
    return 1 if bad else 0


def _write(path: str, report: dict[str, object]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
