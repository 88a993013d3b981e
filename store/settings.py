"""Configuration from the environment (TCTUNE_*), one place for every process."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_build_processes() -> int:
    """Half the cores, 2 to 8: where one NVRTC build takes 0.1 s the GPU's one measuring
    process is the bound whatever their number, where it takes 0.25 s two of them are
    (docs/decisions.md, "Build processes in the embedded service"); the other half is the
    measuring process's, the explorer's and the API's."""
    return max(2, min(8, (os.cpu_count() or 2) // 2))


def default_explore_processes() -> int:
    """A quarter of the cores, 1 to 4: a whole model's jobs propose in turn, at 0.3-1 s a
    proposal on spaces of 150,000 schedules, so one explorer bounds the tuning of a model of
    over a hundred layers (docs/decisions.md, "One explorer thread in the embedded service");
    on two cores the one explorer thread of the API process stays."""
    return max(1, min(4, (os.cpu_count() or 2) // 4))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TCTUNE_", extra="ignore")

    # Where the embedded default keeps its SQLite file and the kernel cache.
    data_dir: Path = Path("./tctune-data")
    # SQLAlchemy URL; empty -> SQLite file in data_dir.
    database_url: str = ""
    # Celery broker (redis://...); empty -> the embedded dispatcher in the API process.
    broker_url: str = ""
    # Measurement backend: cuda when a GPU is visible, else the simulated model.
    backend: Literal["auto", "cuda", "simulated"] = "auto"
    # Seconds a simulated measurement takes (imitates a GPU's timing loop).
    sim_delay_s: float = 0.0
    # Candidates proposed per explorer round, and per build/measure message of the fleet
    # (a round is split into chunks so that several GPUs share it).
    batch_size: int = 32
    chunk_size: int = 8
    # Fleet explorer: a round grows in steps of batch_size up to max_round candidates while
    # GPUs of the target are idle with nothing queued for them (one model update then feeds
    # more GPUs); while the explorer keeps up, rounds stay at batch_size. <= batch_size:
    # fixed rounds.
    max_round: int = 256
    # Fleet explorer: rounds of one job in flight at once (2: the next round is proposed,
    # from what is measured so far, while the current one is measured), and how old the
    # prior (other layers' measurements) handed to a strategy may be, so that its base
    # model is reused across rounds instead of retrained whenever the fleet writes.
    rounds_in_flight: int = 2
    prior_refresh_s: float = 30.0
    # Embedded service: a job proposes its budget in at least this many rounds (of 8 or
    # more), so that a short job of a whole model's tuning starts most of them from the
    # other layers' bests found meanwhile (0: rounds of batch_size).
    job_rounds: int = 4
    # XGBoost threads of each explorer process: a job's model trains on hundreds of rows,
    # where more threads cost more CPU than they save; more cores go to `--procs`.
    xgb_threads: int = 1
    # A measuring worker writes its results at most this many seconds apart: what a worker
    # killed mid-chunk loses (its lease then re-issues the rest); each write is a
    # transaction, so writing less often costs the database less per measurement.
    flush_s: float = 2.0
    # Local processes of the embedded dispatcher.
    build_processes: int = Field(default_factory=default_build_processes)
    # Measuring processes, each owning one local GPU (CUDA_VISIBLE_DEVICES); 0: one per GPU
    # of the local target's model (one without a GPU). More than the GPUs share them, and
    # candidates timed side by side on one GPU slow each other.
    measure_processes: int = Field(default=0, ge=0)
    # Proposals: 1 is a thread of the API process; more are processes, each proposing for
    # the jobs whose id it is given (job id modulo their number), so each keeps its jobs'
    # strategies and models between their rounds.
    explore_processes: int = Field(default_factory=default_explore_processes)
    # Shared kernel cache (cubins); empty -> data_dir/cache.
    cache_dir: str = ""
    # Distributed fleet: how long a worker holds a candidate before another may take it
    # over, how often the explorer sweeps for lost work, and when a sent message counts
    # as lost (not leased by anyone after this many seconds).
    # A worker's thread renews its lease every third of it, so a slow measurement keeps its
    # candidates; the lease matters only for a worker that died or froze. Workers
    # (embedded processes and the fleet's) report to the workers table every heartbeat_s.
    lease_s: float = 120.0
    sweep_s: float = 2.0
    redispatch_s: float = 60.0
    heartbeat_s: float = 5.0
    task_soft_limit_s: float = 900.0
    # A fleet measuring process's worker name (default host-pid) and its GPU slots (a
    # simulated node's threads, each a worker of its own, named name#slot): set by
    # `tctune worker` for the processes it starts.
    worker_name: str = ""
    worker_slots: int = 1
    # A ping per pooled-connection checkout (saves a request from a connection that died
    # with its server); the fleet's processes turn it off: their tasks retry on such an
    # error, which also drops the dead pool, and the ping is a round trip per transaction.
    db_pre_ping: bool = True
    # API access: "required" -> mutating endpoints need a token of the right scope
    # (tctune token create); "off" -> an open service. Reads need a `read` token only
    # when read_auth is set. The embedded default creates and prints a first admin token.
    auth: Literal["required", "off"] = "required"
    read_auth: bool = False
    # Limits: POST /tune per token per minute, active jobs per token, request bodies.
    tune_per_minute: int = 120
    active_jobs_per_token: int = 200
    max_body_bytes: int = 1 << 20
    max_import_bytes: int = 256 << 20
    # GET /schedule keeps found schedules in memory (per API process) and checks them against
    # the database at most this many seconds apart: a better schedule is served at most this
    # long after it lands. 0 -> no cache, every lookup reads the database.
    schedule_cache_s: float = 0.5
    # GET /jobs/{id}/events closes a stream after this many seconds (the client reconnects
    # with Last-Event-ID and misses nothing), so no job holds a connection forever.
    events_max_s: float = 300.0
    # Planted faults of the simulated backend, for fault tests: the fraction of schedules
    # whose measuring child process crashes (deterministic per schedule).
    sim_crash_rate: float = 0.0
    # Tests hold simulated measurements at a gate directory and count them there
    # (workers/backends/simulated.py: pass_gate); empty: no gate.
    sim_gate_dir: str = ""

    @property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'tctune.db').resolve()}"

    @property
    def kernel_cache(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else self.data_dir / "cache"

    @property
    def embedded(self) -> bool:
        return not self.broker_url


@lru_cache
def get_settings() -> Settings:
    return Settings()


def set_for_processes(**fields: object) -> None:
    """Set settings fields for this process and the processes it starts from now on (they
    read the environment, as every process does): TCTUNE_<FIELD> in the environment, and
    the cached settings object dropped so that this process reads them too."""
    for name, value in fields.items():
        if name not in Settings.model_fields:
            raise KeyError(f"no setting {name!r}")
        os.environ[f"TCTUNE_{name.upper()}"] = str(value)
    get_settings.cache_clear()
