"""Every CLI failure is one line that says what failed and what to do, never a traceback:
the command group below turns any exception a command lets escape into such a line."""

from __future__ import annotations

from typing import Any

import click

TOKEN_HINT = ("give one with --token or TCTUNE_TOKEN, or --data DIR: the data directory of "
              "`tctune serve --data DIR`, which keeps its admin token in DIR/token")


def _first_line(text: object) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _safe_url(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


def one_line(exc: BaseException) -> str:
    """What went wrong, in one line."""
    import httpx
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    if isinstance(exc, DBAPIError):
        from store.settings import Settings

        return (f"cannot use the database {_safe_url(Settings().db_url)} "
                f"(TCTUNE_DATABASE_URL): {_first_line(exc.orig)}")
    if isinstance(exc, SQLAlchemyError):
        return f"database error: {_first_line(exc)}"
    if isinstance(exc, httpx.HTTPError):
        url = exc.request.url if isinstance(exc, httpx.RequestError) else None
        where = f"{url.scheme}://{url.netloc.decode()}" if url is not None else ""
        return f"cannot reach the service {where} (--server or TCTUNE_SERVER): " \
               f"{_first_line(exc) or type(exc).__name__}"
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__}: {exc.filename or _first_line(exc)}"
    return f"{type(exc).__name__}: {_first_line(exc)}"


class OneLineErrors(click.Group):
    """A group whose commands fail with one line (click's own errors pass through)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit,
                KeyboardInterrupt):
            raise
        except Exception as exc:
            raise click.ClickException(one_line(exc)) from None


def explain(body: Any) -> str:
    """An API error body as one line; a missing or refused token says how to give one."""
    if isinstance(body, dict) and isinstance(body.get("detail"), list):
        return "; ".join(f"{'.'.join(str(x) for x in e.get('loc', [])[1:])}: {e.get('msg')}"
                         for e in body["detail"])
    if isinstance(body, dict) and "detail" in body:
        detail = str(body["detail"])
        if detail.startswith(("a bearer token is required", "unknown or revoked token")):
            return f"{detail.split(' (')[0]}: {TOKEN_HINT}"
        return detail
    return _first_line(body)
