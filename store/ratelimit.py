"""Token buckets in the database, so that a limit holds for the service as a whole: every
API process (`tctune serve --workers N`, several hosts) takes from the same row. One take
is one UPSERT whose arithmetic runs in the database, so concurrent takes serialise on the
row instead of racing between a read and a write."""

from __future__ import annotations

import time

from sqlalchemy import case, func, literal
from sqlalchemy.orm import Session

from store import repository as repo
from store.models import RateBucket


class RateLimit:
    """`per_minute` requests per key, refilled continuously, at most `per_minute` at once."""

    def __init__(self, name: str, per_minute: int) -> None:
        self.name = name
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0

    def take(self, session: Session, key: object, now: float | None = None) -> float:
        """0 if allowed (and counted), else the seconds until one request would be."""
        now = time.time() if now is None else now
        bucket_key = f"{self.name}:{key}"[:64]
        least = func.least if session.get_bind().dialect.name == "postgresql" else func.min
        refilled = least(literal(self.capacity),
                         RateBucket.level + (literal(now) - RateBucket.at) * self.rate)
        ok = refilled >= 1.0
        stmt = repo.insert_for(session, RateBucket).values(
            key=bucket_key, level=self.capacity - 1.0, at=now, granted=1)
        stmt = stmt.on_conflict_do_update(
            index_elements=["key"],
            set_={"level": case((ok, refilled - 1.0), else_=refilled),
                  "at": literal(now), "granted": case((ok, 1), else_=0)},
        ).returning(RateBucket.level, RateBucket.granted)
        level, granted = session.execute(stmt).one()
        session.commit()  # the take counts even if the request fails afterwards
        if granted:
            return 0.0
        return max((1.0 - level) / self.rate, 0.001)
