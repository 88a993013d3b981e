"""The task bodies: explore (central), build (CPU), measure (GPU).

Plain functions that read and write through `store`. The embedded dispatcher runs them in
local processes and the Celery app wraps the very same functions. Each one can run twice
for the same input (a redelivered message, a restarted process) without writing twice:
the explorer re-issues its open candidates before proposing more, builds only touch
'pending' candidates, and measurements are unique per (task, schedule hash).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import ConvShape, Precision, get_target
from search.strategy import History
from store import hotpath as hp
from store import repository as repo
from store.db import session_scope, statement_scope
from store.models import ACTIVE_JOB_STATES, Job, Task
from workers import artifacts, explorer_stats
from workers.backends.base import Backend, BuildOutcome, MeasureOutcome, TaskSpec
from workers.history import (
    history_of,
    pending_of,
    remember_indices,
    seed_prior,
    strategy_for,
)
from workers.leases import LeaseKeeper
from workers.lru import Lru
from workers.seeds import start_points

log = logging.getLogger(__name__)

# A candidate whose measurement was started this often without a result (its worker died
# each time) is stored as runtime_error instead of being retried for ever.
MAX_ATTEMPTS = 3


def task_spec(task: Task) -> TaskSpec:
    return TaskSpec(ConvShape.from_dict(task.shape), Precision(task.precision),
                    get_target(task.target))


# Task rows never change what a backend needs (shape, precision, target), so each process
# reads one once; the baseline is the one column that moves (None until first timed).
_specs: dict[tuple[str, int], TaskSpec] = {}
_baselined: set[tuple[str, int]] = set()


def spec_of(session: Any, db_url: str, task_id: int) -> TaskSpec | None:
    key = (db_url, task_id)
    spec = _specs.get(key)
    if spec is None:
        task = repo.get_task(session, task_id)
        if task is None:
            return None
        spec = _specs[key] = task_spec(task)
        if task.baseline_us is not None:
            _baselined.add(key)
    return spec


def target_of(db_url: str, candidate_id: int) -> str | None:
    """The target of a candidate's task: which backend (and queue) it needs."""
    with session_scope(db_url) as s:
        task_id = hp.task_of_candidate(s, candidate_id)
        spec = None if task_id is None else spec_of(s, db_url, task_id)
        return spec.target.name if spec else None


def space_of(task: Task) -> ScheduleSpace:
    spec = task_spec(task)
    return ScheduleSpace(spec.shape, spec.precision, spec.target)


# Schedule spaces of the tasks the explorer proposes for: a space is a pure function of
# the task's spec, and its valid-schedule mask costs milliseconds to rebuild each round.
SPACE_CACHE = 256
_spaces: Lru[tuple[str, int], ScheduleSpace] = Lru(SPACE_CACHE)


def cached_space(db_url: str, task_id: int, spec: TaskSpec) -> ScheduleSpace:
    return _spaces.get_or_make((db_url, task_id),
                               lambda: ScheduleSpace(spec.shape, spec.precision, spec.target))


def finish_if_done(session: Any, job: Job) -> bool:
    """Mark the job done once its budget is measured; True if it is finished."""
    if job.status not in ACTIVE_JOB_STATES:
        return True
    if hp.measured_count(session, job.id) >= job.trials:
        repo.set_job_status(session, job, "done")
        artifacts.prune(session, job.id, job.task_id)
        return True
    return False


@dataclass(frozen=True)
class Proposal:
    """What one explore call hands on: candidate ids to dispatch (re-issued ones first),
    and whether the job may take another round right away (fewer in flight than allowed)."""

    ids: list[int]
    more: bool = False
    target: str | None = None  # where they are measured (saves the dispatcher a lookup)


def explore(db_url: str, job_id: int, batch_size: int = 32) -> list[int]:
    """Propose the job's next batch, one round in flight at a time (the embedded
    dispatcher's way); returns the candidate ids to dispatch."""
    return explore_round(db_url, job_id, batch_size).ids


# How often an explorer process asks how many GPUs of a target wait for work (`round_size`);
# in between it counts down what it proposed itself.
UNFED_REFRESH_S = 1.0
_unfed: dict[tuple[str, str], tuple[float, int]] = {}


def round_size(session: Any, db_url: str, target: str, batch_size: int, max_round: int,
               alive_s: float, chunk: int = 1) -> int:
    """Candidates in the next round: `batch_size`, grown in steps of it up to `max_round`
    while GPUs of the target are idle with nothing queued for them (`hotpath.unfed_gpus`),
    `chunk` candidates (a measure message) per idle GPU.

    Why: a round's proposal costs the explorer a fixed part (reads, the pick, writes) and
    the model work its trial count is due (the default's retrainings and boosting steps
    come at set trial counts, sparser as a job grows), so larger rounds cost less per
    candidate. When the explorer keeps up, GPUs are busy and rounds stay small (the model
    updated most often per trial, the best search); when it falls behind, idle GPUs make
    the rounds larger (the replay's cost of larger rounds: bench/RESULTS.md "Search:
    offline replay"). An idle GPU takes a whole message: counting a candidate per GPU
    left a fleet's rounds at a chunk's share of what its idle GPUs could take."""
    if max_round <= batch_size:
        return batch_size
    chunk = max(1, chunk)
    now = time.monotonic()
    key = (db_url, target)
    at, unfed = _unfed.get(key, (-1e18, 0))
    if now - at >= UNFED_REFRESH_S:
        at, unfed = now, hp.unfed_gpus(session, target, alive_s, chunk)
    size = min(max_round, max(batch_size, -(-unfed * chunk // batch_size) * batch_size))
    _unfed[key] = (at, max(0, unfed - -(-size // chunk)))
    return size


# A paced job's rounds hold at least this many candidates (a measure message's worth).
MIN_PACED_ROUND = 8


def paced_round(trials: int, job_rounds: int) -> int:
    """The largest round of a job of `trials` spread over at least `job_rounds` rounds (0:
    no limit). Why: the layers of a model are tuned at once, and a job's rounds take its
    neighbours' bests as they are found (workers/seeds.py); a short job (a whole model at a
    few dozen trials a layer) whose budget went out in one round would spend it before any
    neighbour had measured anything."""
    if job_rounds <= 0:
        return trials
    return max(MIN_PACED_ROUND, -(-trials // job_rounds))


def explore_round(db_url: str, job_id: int, batch_size: int = 32, rounds_in_flight: int = 1,
                  prior_refresh_s: float = 0.0, max_round: int = 0,
                  alive_s: float = 20.0, pipeline_after: int = 0, chunk: int = 1,
                  job_rounds: int = 0) -> Proposal:
    """Propose the job's next round unless `rounds_in_flight` rounds are open already.

    Open candidates never sent (or forgotten) are returned to be dispatched again. With
    more than one round in flight (pipelining), the new round is proposed from what is
    measured so far, with the open candidates as pending so that none is proposed twice,
    and never beyond the budget: proposals stop at trials - measured - open. A round holds
    `batch_size` candidates, or up to `max_round` while GPUs of the target wait for work
    (`round_size`; a worker is alive whose heartbeat is at most `alive_s` old; an idle GPU
    takes `chunk` candidates). With
    `pipeline_after`, a round is proposed while another is open only once the job has that
    many trials measured (a strategy proposing from no measurement at all proposes blind).
    With `job_rounds`, a job proposes its budget in at least that many rounds (`paced_round`).
    """
    with session_scope(db_url) as s:
        job = repo.get_job(s, job_id, lock=True)  # one explorer per job at a time
        if job is None or job.status not in ACTIVE_JOB_STATES:
            return Proposal([])
        spec = spec_of(s, db_url, job.task_id)
        assert spec is not None  # a job's task lives as long as the job
        target = spec.target.name
        open_rows, measured = hp.open_and_measured(s, job_id)
        resend = [r.id for r in open_rows if not r.dispatched]
        repo.mark_dispatched(s, resend)
        in_flight = len({r.round for r in open_rows})
        if in_flight >= max(1, rounds_in_flight) or (in_flight and measured < pipeline_after):
            return Proposal(resend, target=target)
        if not open_rows and measured >= job.trials:
            finish_if_done(s, job)
            return Proposal([])
        remaining = job.trials - measured - len(open_rows)
        if remaining <= 0:
            return Proposal(resend, target=target)
        space = cached_space(db_url, job.task_id, spec)
        started = time.perf_counter()
        history = history_of(s, db_url, job.task_id, target, spec.precision.value, space,
                             prior_refresh_s)
        history.pending = pending_of(s, db_url, job.task_id, space, open_rows)
        strategy = strategy_for(db_url, job, space)
        size = min(round_size(s, db_url, target, batch_size, max_round, alive_s, chunk),
                   remaining, paced_round(job.trials, job_rounds))
        # The seeds from the newest prior; the strategy's moves only as it grows by half.
        fresh = seed_prior(s, db_url, job.task_id, target, spec.precision.value,
                           prior_refresh_s)
        seeds = start_points(spec, space, History(trials=history.trials,
                                                  pending=history.pending, prior=fresh))[:size]
        history.pending |= set(seeds)
        picks = seeds + strategy.propose(history, size - len(seeds))
        seconds = time.perf_counter() - started
        # One line per proposal: the fleet benchmark reads the explorer's latency from it.
        log.info("proposal job=%d strategy=%s n=%d history=%d pending=%d prior=%d "
                 "seconds=%.4f", job.id, job.strategy, len(picks), len(history.trials),
                 len(history.pending), len(history.prior), seconds)
        explorer_stats.record_proposal(seconds, len(picks))
        explorer_stats.flush(db_url)  # at most every few seconds: see explorer_stats
        if not picks:
            if open_rows:  # what is left unseen is on its way: wait for it
                return Proposal(resend, target=target)
            repo.set_job_status(s, job, "done",
                                error="search space exhausted before the trial budget")
            return Proposal([])
        # Written only now: on SQLite the first write takes the database's write lock, which
        # must not be held while the strategy thinks.
        repo.set_job_status(s, job, "running")
        # Model-based strategies say what they predicted; the dashboard plots it.
        predictions, insight = describe_round(strategy, job.id, history, picks)
        if insight:
            job.insight = insight
        # The next round's number and the dispatch stamp go in with the rows (the job's
        # row lock keeps the round number ours).
        scheds = space.schedules(picks)
        hashes = [schedule_hash(x) for x in scheds]
        ids = hp.add_candidates(s, job.id, job.task_id, scheds, None,
                                [predictions.get(i) for i in picks], dispatched=True,
                                hashes=hashes)
        # Their hashes map to their indices from now on (`workers.history.pending_of`).
        remember_indices(db_url, job.task_id, zip(hashes, picks, strict=True))
        more = in_flight + 1 < rounds_in_flight and remaining > len(ids)
        return Proposal(resend + ids, more, target)


# The knob importance (a job's insight, for the dashboard) at most this often per job: it
# averages the model's score over the whole space per knob value, which cost a seventh of
# a diversity proposal. The predicted latency of each pick is worked out every round.
INSIGHT_EVERY_S = 10.0
_insight_at: Lru[int, float] = Lru(4096)


def describe_round(strategy: Any, job_id: int, history: Any, picks: Sequence[int],
                   now: float | None = None) -> tuple[dict[int, float], dict[str, Any] | None]:
    """(predicted latency per pick, insight or None) after a proposal: the strategy's own
    `describe` when the job's insight is due, else only its predictions."""
    describe = getattr(strategy, "describe", None)
    if describe is None:
        return {}, None
    now = time.monotonic() if now is None else now
    last = _insight_at.get(job_id)
    if last is None or now - last >= INSIGHT_EVERY_S:
        _insight_at.put(job_id, now)
        return describe(history, picks)  # type: ignore[no-any-return]
    return strategy.predicted_latency(history, picks)[0], None


def build_many(db_url: str, candidate_ids: Sequence[int], backend: Backend,
               publish: bool = False) -> int:
    """Build the still-pending candidates among `candidate_ids`; returns how many it built.
    `publish`: store each cubin in the database for GPU workers on other hosts."""
    with session_scope(db_url) as s:
        todo = [(row.id, spec, dict(row.schedule)) for row in hp.pending_among(s, candidate_ids)
                if (spec := spec_of(s, db_url, row.task_id)) is not None]
    cache_dir = getattr(backend, "cache_dir", None)
    done = []
    for cid, spec, schedule in todo:
        outcome = backend.build(spec, schedule)
        if publish and cache_dir and outcome.status == "ok" and outcome.artifact:
            artifacts.publish(db_url, cache_dir, outcome.artifact)
        done.append((cid, outcome.status, outcome.artifact, outcome.log))
    with session_scope(db_url) as s:
        repo.record_builds(s, done)
    return len(todo)


@dataclass
class _Leased:
    cand_id: int
    task_id: int
    spec: TaskSpec
    schedule: dict[str, Any]
    schedule_hash: str
    job_id: int
    predicted_us: float | None
    built: BuildOutcome


@dataclass(frozen=True)
class ChunkResult:
    written: int
    closed: set[int]  # jobs one of whose rounds this chunk closed: each needs a new round


@dataclass
class WriteGroup:
    """Results of one chunk (or part of one) to write in one transaction, with what the
    writer owes back: the rows written, and which of `rounds` closed (asked after the
    commit)."""

    results: list[tuple[_Leased, MeasureOutcome]]
    backend: str
    worker: str
    baselines: dict[int, float]
    rounds: set[tuple[int, int]] | None = None


class Writer(Protocol):
    """Writes groups of results; returns (rows written, jobs one of whose rounds closed).
    It returns only once the group is committed: the caller's message is acknowledged
    after that, so an acknowledged result is never lost."""

    def write(self, group: WriteGroup) -> tuple[int, set[int]]: ...


def measure_many(db_url: str, candidate_ids: Sequence[int], backend: Backend, worker: str,
                 lease_s: float, flush_s: float = 1.0) -> int:
    """Measure a chunk of candidates and store each result once; returns rows written."""
    return measure_chunk(db_url, candidate_ids, backend, worker, lease_s, flush_s).written


def measure_chunk(db_url: str, candidate_ids: Sequence[int], backend: Backend, worker: str,
                  lease_s: float, flush_s: float = 1.0,
                  writer: Writer | None = None) -> ChunkResult:
    """Measure a chunk of candidates and store each result once.

    The chunk is leased in one transaction; results are written in groups (at most
    `flush_s` apart) so that a worker killed mid-chunk loses at most that much work, and
    the rest of the chunk is re-issued to another worker once its lease expires. Every
    step is a handful of set-wise statements, whatever the chunk's size. Which rounds the
    chunk closed is asked after its last commit, so that of two workers finishing one
    round's last candidates at once, the later one sees the round closed. `writer`: where
    the groups go (a process's shared batcher, `workers.batcher`); by default each is a
    transaction of this call's own.
    """
    def flush(group: WriteGroup) -> tuple[int, set[int]]:
        if writer is not None:
            return writer.write(group)
        return write_groups(db_url, [group])[0]

    leased: list[_Leased] = []
    gave_up: list[tuple[_Leased, MeasureOutcome]] = []
    baselines_needed: dict[int, TaskSpec] = {}
    # The lease is one statement on PostgreSQL and what follows only reads: no transaction.
    with statement_scope(db_url) as s:
        rows, rounds = hp.lease_chunk(s, candidate_ids, worker, lease_s)
        baseline_here = baselines_to_time(s, db_url, rows, backend)
        for row in rows:
            spec = spec_of(s, db_url, row.task_id)
            assert spec is not None  # a candidate's task is deleted with it
            item = _Leased(row.id, row.task_id, spec, dict(row.schedule), row.schedule_hash,
                           row.job_id, row.predicted_us,
                           BuildOutcome(row.build_status or "", row.artifact,
                                        row.build_log or ""))
            if row.attempts >= MAX_ATTEMPTS:  # its workers died each time it was taken
                gave_up.append((item, MeasureOutcome(
                    "runtime_error", error=f"gave up after {row.attempts} attempts "
                                           "without a result")))
                continue
            if row.task_id in baseline_here:
                baselines_needed[row.task_id] = spec
            leased.append(item)
    # The lease is renewed as the chunk makes progress, so that a worker slowed down (a
    # busy host, a long baseline or build) keeps what it holds and no live worker's
    # candidate is taken by another; one that stalls past its lease skips what another
    # worker took meanwhile. Between steps the loop renews it and learns what it still
    # holds; during one long step (a measurement that outlasts the lease on a loaded host)
    # the keeper thread renews it.
    backend.prepare([(i.spec, i.schedule) for i in leased])
    with LeaseKeeper(db_url, [i.cand_id for i in leased], worker, lease_s):
        renew_at = time.monotonic() + lease_s / 2
        baselines = {tid: b for tid, spec in baselines_needed.items()
                     if (b := _baseline(spec, backend)) is not None}

        written = flush(WriteGroup(gave_up, backend.name, worker, {}))[0] if gave_up else 0
        pending: list[tuple[_Leased, MeasureOutcome]] = []
        last_flush = time.monotonic()
        cache_dir = getattr(backend, "cache_dir", None)
        held = {item.cand_id for item in leased}
        for k, item in enumerate(leased):
            if time.monotonic() >= renew_at:
                with statement_scope(db_url) as s:
                    held = hp.renew_leases(s, [i.cand_id for i in leased], worker, lease_s)
                renew_at = time.monotonic() + lease_s / 2
            if item.cand_id not in held:
                continue
            built = item.built
            if not built.status or (cache_dir and built.status == "ok" and built.artifact
                                    and not artifacts.fetch(db_url, cache_dir, built.artifact)):
                built = backend.build(item.spec, item.schedule)  # nobody built it for this host
            pending.append((item, backend.measure(item.spec, item.schedule, built)))
            # Not after the last one: the final write follows at once (one transaction, not two).
            if k + 1 < len(leased) and time.monotonic() - last_flush >= flush_s:
                written += flush(WriteGroup(pending, backend.name, worker, baselines))[0]
                pending, baselines, last_flush = [], {}, time.monotonic()
        if not pending and not baselines and not rounds:
            return ChunkResult(written, set())
        wrote, closed = flush(WriteGroup(pending, backend.name, worker, baselines, rounds))
        return ChunkResult(written + wrote, closed)


def write_groups(db_url: str, groups: Sequence[WriteGroup]) -> list[tuple[int, set[int]]]:
    """Write groups of results in one transaction (best schedules and job states follow);
    then, after its commit, ask which of their rounds have no open candidate left. Per
    group: (rows it wrote, jobs one of whose rounds closed). A schedule in two groups (two
    jobs of one task) counts for the first."""
    rounds = set().union(*(g.rounds or set() for g in groups))
    with session_scope(db_url) as s:
        wrote = _write(s, groups)
    closed: set[int] = set()
    if rounds:  # asked after the commit: see the sibling chunks' results
        with statement_scope(db_url) as s:
            closed = hp.closed_rounds(s, rounds)
    out = []
    for g in groups:
        _baselined.update((db_url, t) for t in g.baselines)
        mine = {(i.task_id, i.schedule_hash) for i, _ in g.results} & wrote
        wrote -= mine
        out.append((len(mine), {j for j, _ in g.rounds or set()} & closed))
    return out


def _write(s: Any, groups: Sequence[WriteGroup]) -> set[tuple[int, str]]:
    """Groups of results in the session's transaction; the (task, schedule hash) pairs
    written. Rows go in (task, hash) order so that two writers' transactions take the
    unique index's locks in the same order (no deadlock between batches)."""
    results = sorted(((i, o, g) for g in groups for i, o in g.results),
                     key=lambda r: (r[0].task_id, r[0].schedule_hash, r[0].cand_id))
    wrote: set[tuple[int, str]] = set()
    now_best: dict[int, float] | None = None
    if results:
        wrote, now_best = hp.write_results(s, [{
            "task_id": item.task_id, "job_id": item.job_id, "schedule": item.schedule,
            "schedule_hash": item.schedule_hash, "status": out.status,
            "median_us": out.median_us, "iqr_us": out.iqr_us, "backend": g.backend,
            "worker": g.worker, "error": (out.error or None) and out.error[-20000:],
            "predicted_us": item.predicted_us} for item, out, g in results],
            sorted(item.cand_id for item, _, _ in results))
    # A baseline stamps its task's best_schedule row: under the task's lock, taken with the
    # bests' in one sorted sweep (store/hotpath.py, _BEST_LOCK_PG).
    hp.refresh_best_after_write(s, [
        (i.task_id, i.schedule_hash, o.median_us) for i, o, _ in results
        if o.status == "ok" and o.median_us is not None
        and (i.task_id, i.schedule_hash) in wrote], now_best,
        lock_also=[t for g in groups for t in g.baselines])
    for g in groups:
        for task_id, us in g.baselines.items():
            repo.set_baseline(s, task_id, us, g.backend)
    if not results:
        return set()
    for job_id in hp.jobs_reaching_budget(s, {item.job_id for item, _, _ in results}):
        job = repo.get_job(s, job_id)
        if job is not None:
            finish_if_done(s, job)
    return wrote


def baselines_to_time(session: Any, db_url: str, rows: Sequence[hp.ChunkRow],
                      backend: Backend) -> set[int]:
    """The tasks of a leased chunk whose baseline this worker times: those without one
    whose job's first open candidate is in the chunk. The chunks of a task's first round
    go to several workers at once, before any has written a baseline; this way one of them
    times it instead of each. If it gets none (a failure, no torch), the chunk holding the
    next first open candidate tries again."""
    if getattr(backend, "baseline_us", None) is None:
        return set()
    unknown = {r.task_id for r in rows if (db_url, r.task_id) not in _baselined}
    if not unknown:
        return set()
    _baselined.update((db_url, t) for t in hp.tasks_with_baseline(session, unknown))
    wanted = [r for r in rows if (db_url, r.task_id) not in _baselined]
    if not wanted:
        return set()
    first = hp.first_open_candidates(session, {r.job_id for r in wanted})
    return {r.task_id for r in wanted if first.get(r.job_id) == r.id}


def _baseline(spec: TaskSpec, backend: Backend) -> float | None:
    """The layer's baseline latency (cuDNN fp16, or fp32 for fp32_tc: store/baselines.py),
    where the backend can time it; None where it cannot (or did not)."""
    timer = getattr(backend, "baseline_us", None)
    if timer is None:
        return None
    try:
        us = timer(spec)
    except Exception:  # a baseline is nice to have; its failure must not lose the result
        log.exception("baseline timing failed for %s", spec.shape.key())
        return None
    return None if us is None else float(us)
