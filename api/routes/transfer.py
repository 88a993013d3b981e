"""GET /export and POST /import: measurements and best schedules as JSON lines (the format
is documented in store/transfer.py and the README)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.auth import Admin, Reader
from api.deps import DB
from api.errors import READ_ERRORS
from api.inputs import PrecisionFilter, TargetFilter
from store import transfer
from store.db import session_scope

router = APIRouter(tags=["transfer"])

NDJSON = "application/x-ndjson"


class ImportOut(BaseModel):
    lines: int
    imported: int
    already_present: int
    tasks: int


@router.get("/export", response_class=StreamingResponse,
            responses={**READ_ERRORS,
                       200: {"content": {NDJSON: {}}, "description": "JSON lines"}})
def export(session: DB, _: Reader, target: TargetFilter,
           precision: PrecisionFilter) -> StreamingResponse:
    lines = list(transfer.export_lines(session, target, precision))  # read inside the session
    return StreamingResponse(iter(lines), media_type=NDJSON,
                             headers={"Content-Disposition":
                                      'attachment; filename="tctune-export.jsonl"'})


@router.post("/import", response_model=ImportOut,
             responses={401: {"description": "no valid token"},
                        403: {"description": "needs an admin token"},
                        413: {"description": "body too large"},
                        422: {"description": "a line is invalid; nothing was imported"}},
             # The body is read raw (it may be large); declared so that clients and the
             # schema-driven tests know it.
             openapi_extra={"requestBody": {"required": True, "content": {NDJSON: {
                 "schema": {"type": "string",
                            "description": "JSON lines, as GET /export writes them"}}}}})
async def import_(request: Request, _: Admin) -> ImportOut:
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            "the body must be UTF-8 JSON lines") from None
    report = await run_in_threadpool(_import, request.app.state.settings.db_url, text)
    if report.errors:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            {"msg": "nothing was imported", "errors": report.errors})
    return ImportOut(lines=report.lines, imported=report.imported,
                     already_present=report.already_present, tasks=report.tasks)


class _Invalid(Exception):
    def __init__(self, report: transfer.ImportReport) -> None:
        self.report = report


def _import(db_url: str, text: str) -> transfer.ImportReport:
    try:
        with session_scope(db_url) as session:
            report = transfer.import_lines(session, text.splitlines())
            if report.errors:
                raise _Invalid(report)  # rolls the transaction back
    except _Invalid as bad:
        return bad.report
    return report
