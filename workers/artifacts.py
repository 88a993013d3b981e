"""Built kernels travel from CPU builders to GPU workers through the database.

A builder publishes each cubin and its launch metadata under the build's cache key; a GPU
worker on another host that lacks the key in its local cache fetches it before measuring.
Rows of a finished job are pruned, except the artifact of its task's best schedule."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.orm import Session

from store import repository as repo
from store.db import session_scope


def _paths(cache_dir: str | os.PathLike[str], key: str) -> tuple[Path, Path]:
    from kernels.build import cubin_path

    cubin = cubin_path(cache_dir, key)
    return cubin, cubin.with_suffix(".json")


def publish(db_url: str, cache_dir: str | os.PathLike[str], key: str) -> bool:
    """Store the cached build `key` in the database (once); False if it is not cached."""
    cubin, meta = _paths(cache_dir, key)
    if not (cubin.exists() and meta.exists()):
        return False
    with session_scope(db_url) as s:
        repo.publish_artifact(s, key, cubin.read_bytes(), meta.read_text())
    return True


def fetch(db_url: str, cache_dir: str | os.PathLike[str], key: str) -> bool:
    """Make sure the build `key` is in the local cache; False if nobody published it."""
    cubin, meta = _paths(cache_dir, key)
    if cubin.exists() and meta.exists():
        return True
    with session_scope(db_url) as s:
        found = repo.get_artifact(s, key)
    if found is None:
        return False
    data, text = found
    cubin.parent.mkdir(parents=True, exist_ok=True)
    for path, payload in ((cubin, data), (meta, text.encode())):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(payload)
        os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
    return True


def prune(session: Session, job_id: int, task_id: int) -> int:
    """Drop the artifacts of a finished job's candidates, except its task's best one."""
    return repo.prune_artifacts(session, job_id, task_id)
