"""A small Python client of the tctune API (httpx), used by the CLI, and `from_service`:
a deploy-time conv op built from the service's best schedule."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from kernels.spec import ConvShape, Precision, Target, get_target

if TYPE_CHECKING:
    from kernels.runtime import Conv2d

DEFAULT_SERVER = "http://127.0.0.1:8000"
TERMINAL = ("done", "failed", "cancelled")


def _retry_after(resp: httpx.Response) -> float | None:
    """Retry-After in seconds (the service sends seconds, never an HTTP date)."""
    try:
        return float(resp.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


class TctuneError(RuntimeError):
    def __init__(self, status: int, body: Any, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body
        # The seconds a 429 or 503 asks the client to wait before it asks again.
        self.retry_after = retry_after


def shape_query(shape: ConvShape) -> dict[str, Any]:
    d = shape.to_dict()
    for name in ("stride", "pad", "dilation"):
        d[name] = ",".join(str(v) for v in d[name])
    return d


class Client:
    def __init__(self, server: str = DEFAULT_SERVER, token: str | None = None,
                 timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout)

    def _json(self, resp: httpx.Response, ok: tuple[int, ...] = (200,)) -> Any:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
        if resp.status_code not in ok:
            raise TctuneError(resp.status_code, body, _retry_after(resp))
        return body

    def tune(self, shape: ConvShape, precision: str, target: str, trials: int = 500,
             strategy: str | None = None, seed: int = 0,
             strategy_options: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"shape": shape.to_dict(), "precision": precision,
                                "target": target, "trials": trials, "seed": seed}
        if strategy:
            body["strategy"] = strategy
        if strategy_options:
            body["strategy_options"] = strategy_options
        return self._json(self.http.post("/tune", json=body), ok=(200, 202))  # type: ignore

    def job(self, job_id: int, after: int = 0) -> dict[str, Any]:
        return self._json(self.http.get(f"/jobs/{job_id}", params={"after": after}))  # type: ignore

    def wait(self, job_id: int, poll_s: float = 0.5,
             on_update: Callable[[dict[str, Any]], None] | None = None,
             timeout_s: float | None = None) -> dict[str, Any]:
        """Poll until the job ends; `on_update` sees each state (measurements since the last)."""
        after, start = 0, time.monotonic()
        while True:
            state = self.job(job_id, after=after)
            after = state["next_after"]
            if on_update:
                on_update(state)
            if state["status"] in TERMINAL:
                return state
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"job {job_id} still {state['status']} after {timeout_s} s")
            time.sleep(poll_s)

    def wait_many(self, job_ids: list[int], poll_s: float = 1.0,
                  on_update: Callable[[dict[int, dict[str, Any]]], None] | None = None,
                  timeout_s: float | None = None) -> dict[int, dict[str, Any]]:
        """Poll every job until all have ended; `on_update` sees the latest state of each
        (by job id) after every pass. Only the jobs still active are asked again, each for
        its new measurements only, which are not kept: a state is the job's summary."""
        after = dict.fromkeys(job_ids, 0)
        states: dict[int, dict[str, Any]] = {}
        start = time.monotonic()
        while True:
            for job_id in job_ids:
                if job_id in states and states[job_id]["status"] in TERMINAL:
                    continue
                state = self.job(job_id, after=after[job_id])
                after[job_id] = state["next_after"]
                states[job_id] = {**state, "measurements": []}
            if on_update:
                on_update(states)
            if all(s["status"] in TERMINAL for s in states.values()):
                return states
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                active = sorted(j for j, s in states.items() if s["status"] not in TERMINAL)
                raise TimeoutError(f"{len(active)} of {len(job_ids)} jobs still active after "
                                   f"{timeout_s:g} s (jobs {', '.join(map(str, active))})")
            time.sleep(poll_s)

    def schedule(self, shape: ConvShape, precision: str, target: str) -> dict[str, Any] | None:
        """The best schedule, or None when there is none yet."""
        return self.schedule_or_reason(shape, precision, target)[0]

    def schedule_or_reason(self, shape: ConvShape, precision: str, target: str
                           ) -> tuple[dict[str, Any] | None, str]:
        """(the best schedule, ''), or (None, what the service says of a layer it has no
        verified schedule for: its 404's detail, a job tuning it, the batches it has one at)."""
        params = {**shape_query(shape), "precision": precision, "target": target}
        resp = self.http.get("/schedule", params=params)
        if resp.status_code == 404:
            return None, str(resp.json().get("detail", "no verified schedule yet"))
        return self._json(resp), ""

    def lookup(self, layers: list[tuple[ConvShape, str, str]], runners_up: int = 0
               ) -> list[dict[str, Any]]:
        """Best schedules of many (shape, precision, target) layers, in order; each result
        has found=False where none is known yet. `runners_up`: each found one also lists
        its next fastest schedules, up to that many."""
        body: dict[str, Any] = {"layers": [{"shape": sh.to_dict(), "precision": p, "target": t}
                                           for sh, p, t in layers]}
        if runners_up:
            body["runners_up"] = runners_up
        return self._json(self.http.post("/schedules/lookup", json=body))["results"]  # type: ignore

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._json(self.http.post(f"/jobs/{job_id}/cancel"))  # type: ignore

    def export(self, target: str | None = None, precision: str | None = None) -> str:
        params = {k: v for k, v in (("target", target), ("precision", precision)) if v}
        resp = self.http.get("/export", params=params)
        if resp.status_code != 200:
            self._json(resp)  # raises with the server's reason
        return resp.text

    def import_lines(self, text: str) -> dict[str, Any]:
        resp = self.http.post("/import", content=text.encode(),
                              headers={"content-type": "application/x-ndjson"})
        return self._json(resp)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.http.close()


def from_service(client_or_url: Client | str, shape: ConvShape, precision: Precision | str,
                 target: Target | str, **kwargs: Any) -> Conv2d:
    """The layer's best tuned schedule from a tctune service (`GET /schedule`), built as a
    `kernels.runtime.Conv2d`.

    client_or_url: a `Client` (anything with `.schedule(shape, precision, target)`) or the
    service's URL. Where the service knows no schedule yet, the op falls back to the default
    with a DefaultScheduleWarning. kwargs go to `Conv2d`.
    """
    # Imported here: the CLI uses this module and never builds a kernel.
    from kernels.runtime import Conv2d

    p = Precision(precision)
    t = get_target(target) if isinstance(target, str) else target
    own = isinstance(client_or_url, str)
    client = Client(client_or_url) if isinstance(client_or_url, str) else client_or_url
    try:
        found = client.schedule(shape, p.value, t.name)
    finally:
        if own:
            client.close()
    if found is None:
        return Conv2d(shape, p, None, t, **kwargs)
    op = Conv2d(shape, p, found["schedule"], t, **kwargs)
    sim = ", simulated" if found.get("simulated") else ""
    note = f"; {found['simulated_note']}" if found.get("simulated_note") else ""
    op.schedule_source = (f"service: job {found.get('job_id')}, {found.get('latency_us')} us "
                          f"({found.get('backend')}{sim}{note})")
    return op
