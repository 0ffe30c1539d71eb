"""The dashboard's Starlette app: pages, the fragments they refresh, and the buttons.

Routes: ``/`` (queues with their counts and state, kinds, throughput, workers, failed and
recent jobs), ``/jobs/{id}`` (one job, its recorded steps, and links to the jobs it waits on
and to those waiting on it), ``/live/...`` (the same bodies alone, which
``static/dashboard.js`` swaps in every few seconds), ``POST /jobs/{id}/retry``,
``/cancel`` and ``/wake`` (a sleeping job), ``GET /search`` (jobs by tag, kind, status, queue,
key, error text, age) and its ``POST /bulk/retry``, ``/cancel`` and ``/delete``, and
``POST /queues/pause``, ``/resume``, ``/limit`` and ``/clear`` (the queue,
and a limit's concurrency and rate, in the form's fields). Database calls block, so each runs
in Starlette's thread pool with a connection of its own (``data``); a database that is
away, or a schema that is missing, becomes one banner on the page (503), never a traceback,
above the last data the page read, greyed and dated (``memory``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from shardworker.core import counts
from shardworker.dashboard import data
from shardworker.dashboard.chart import HEIGHT, WIDTH, chart
from shardworker.dashboard.memory import Memory
from shardworker.dashboard.security import GuardedPosts, TokenAuth, unauthorized
from shardworker.errors import JobsError, ShardworkerError
from shardworker.jobs import dumps_json

HERE = Path(__file__).parent
REFRESH_MS = 2000
DONE = {"retry": "queued again", "cancel": "cancelled", "wake": "woken"}
BULK_DONE = {"retry": "queued again", "cancel": "cancelled", "delete": "deleted"}
QUEUE_DONE = {"pause": "paused", "resume": "resumed"}  # limit and clear: the limits the queue has now
MAX_JOB_ID = 2**63 - 1  # ids are bigint
MAX_FORM_BYTES = 4096  # a queue's name (255 bytes, thrice that escaped) and its limits fit


def when(value: datetime | None) -> str:
    return "" if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


def clock(value: datetime) -> str:
    return f"{value.astimezone(UTC):%H:%M:%S}"


def ago(seconds: float) -> str:
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def age(seconds: float | None) -> str:
    return "-" if seconds is None else counts.age_text(seconds)


def pretty(value: Any) -> str:
    return dumps_json(value, indent=True)


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(when=when, clock=clock, ago=ago, age=age, pretty=pretty,
                                 first_line=lambda text: (text or "").splitlines()[0] if text else "")
    templates.env.globals.update(refresh_ms=REFRESH_MS, chart_width=WIDTH, chart_height=HEIGHT, split=counts.SPLIT,
                                 kind_counts=data.KIND_COUNTS)
    return templates


class Dashboard:
    """The endpoints, bound to one database."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.templates = _templates()
        self.memory = Memory()

    async def _load(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        """``fn(dsn, *args)`` in the thread pool: (its value, None), or (None, why the database said no)."""
        try:
            return await run_in_threadpool(fn, self.dsn, *args), None
        except JobsError:
            raise
        except ShardworkerError as exc:
            return None, str(exc).removeprefix("database unavailable: ")  # the banner says it once

    def _render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        return self.templates.TemplateResponse(request, name, context, status_code=status)

    async def overview(self, request: Request, refused: str | None = None) -> Response:
        """The front page (or its live fragment); with ``refused``, the page a queue button
        whose input was refused answers with (400), saying why."""
        found, db_error = await self._load(data.overview)
        shown = self.memory.shown("overview", found, db_error)
        page = "_overview.html" if request.url.path.startswith("/live/") else "overview.html"
        status = 503 if db_error else 400 if refused else 200
        notice = None if refused else self._notice(request) or queue_notice(request, found)
        o = shown.value
        return self._render(request, page, status, o=o, chart=chart(o.minutes) if o else None, shown=shown,
                            db_error=db_error, notice=notice, refused=refused)

    async def job(self, request: Request) -> Response:
        job_id = path_job_id(request)
        found, db_error = await self._load(data.job, job_id)
        shown = self.memory.shown(("job", job_id), found, db_error)
        if found is None and db_error is None:
            raise HTTPException(404, f"no job {job_id}")
        page = "_job.html" if request.url.path.startswith("/live/") else "job.html"
        return self._render(request, page, 503 if db_error else 200, page=shown.value, shown=shown, job_id=job_id,
                            db_error=db_error, notice=self._notice(request))

    async def change(self, request: Request) -> Response:
        """A retry, cancel or wake button: back where it was pressed, or the job's page with why not (409)."""
        action, job_id = request.path_params["action"], path_job_id(request)
        if action not in DONE:
            raise HTTPException(404, f"no such button: {action}")
        back = "/" if request.query_params.get("back") == "overview" else f"/jobs/{job_id}"
        try:
            _, db_error = await self._load(data.change, action, job_id)
        except JobsError as exc:
            found, db_error = await self._load(data.job, job_id)
            if found is None and db_error is None:
                raise HTTPException(404, f"no job {job_id}") from None
            return self._render(request, "job.html", 409, page=found, job_id=job_id, db_error=db_error,
                                notice=None, refused=str(exc))
        if db_error:
            return self._render(request, "error.html", 503, db_error=db_error, notice=None)
        return RedirectResponse(f"{back}?done={action}&job={job_id}", status_code=303)

    async def search(self, request: Request) -> Response:
        """Jobs found by tag, kind, status, queue, key, error text or age, with bulk buttons."""
        fields = {name: request.query_params.get(name, "") for name in data.SEARCH_FIELDS}
        try:
            found, db_error = await self._load(data.search, fields)
        except JobsError as exc:
            found, db_error, refused = None, None, str(exc)
        else:
            refused = None
        action = request.query_params.get("done")
        count = request.query_params.get("count", "")
        notice = (f"{count} job{'' if count == '1' else 's'} {BULK_DONE[action]}"
                  if action in BULK_DONE and count.isascii() and count.isdigit() else None)
        return self._render(request, "search.html", 503 if db_error else 400 if refused else 200, found=found,
                            fields=fields, query=urlencode({k: v for k, v in fields.items() if v}),
                            db_error=db_error, notice=notice, refused=refused)

    async def bulk(self, request: Request) -> Response:
        """A search's Retry, Cancel or Delete all button: back to the search, saying how many."""
        action = request.path_params["action"]
        if action not in BULK_DONE:
            raise HTTPException(404, f"no such button: {action}")
        form = await read_form(request)
        fields = {name: form.get(name, "") for name in data.SEARCH_FIELDS}
        try:
            count, db_error = await self._load(data.bulk, action, fields)
        except JobsError as exc:
            return self._render(request, "search.html", 400, found=None, fields=fields, query="", db_error=None,
                                notice=None, refused=f"nothing changed: {exc}")
        if db_error:
            return self._render(request, "error.html", 503, db_error=db_error, notice=None)
        kept = {k: v for k, v in fields.items() if v}
        return RedirectResponse("/search?" + urlencode({**kept, "done": action, "count": count}), status_code=303)

    async def change_queue(self, request: Request) -> Response:
        """A queue's Pause, Resume, Set (limits) or Clear button: back to the overview, which
        says what changed, or the overview with why not (400), nothing written."""
        action = request.path_params["action"]
        if action not in data.QUEUE_ACTIONS:
            raise HTTPException(404, f"no such button: {action}")
        form = await read_form(request)
        name = form.get("queue", "")
        try:
            _, db_error = await self._load(data.change_queue, action, name, form.get("concurrency", ""),
                                           form.get("rate", ""))
        except JobsError as exc:
            return await self.overview(request, refused=f"nothing changed: {exc}")
        if db_error:
            return self._render(request, "error.html", 503, db_error=db_error, notice=None)
        return RedirectResponse("/?" + urlencode({"done": action, "queue": name}), status_code=303)

    @staticmethod
    def _notice(request: Request) -> str | None:
        """The line a redirect after a button asks for (fixed text: nothing of the query is
        echoed); a ``job=`` that is no job id is a 400 page."""
        action = request.query_params.get("done")
        if action not in DONE:
            return None
        job_id = job_id_or_none(request.query_params.get("job", ""))
        if job_id is None:
            raise HTTPException(400, "job= is not a job id")
        return f"job {job_id} {DONE[action]}"

    async def not_found(self, request: Request, exc: Exception) -> Response:
        detail = exc.detail if isinstance(exc, HTTPException) else "not found"
        return self._render(request, "not_found.html", 404, detail=detail, db_error=None, notice=None)

    async def bad_request(self, request: Request, exc: Exception) -> Response:
        detail = exc.detail if isinstance(exc, HTTPException) else "bad request"
        return self._render(request, "not_found.html", 400, detail=detail, heading="Bad request",
                            db_error=None, notice=None)


def queue_notice(request: Request, found: data.Overview | None) -> str | None:
    """The line a redirect after a queue button asks for, naming the queue only when it is one
    the page lists (a crafted link cannot make the page say anything else), with its state."""
    action, name = request.query_params.get("done"), request.query_params.get("queue")
    row = next((q.info for q in found.queues if q.info.name == name), None) if found else None
    if row is None or action not in data.QUEUE_ACTIONS:
        return None
    if action in QUEUE_DONE:
        return f"queue {row.name} {QUEUE_DONE[action]}"
    limits = [f"{label} {value}" for label, value in (("concurrency", row.concurrency), ("rate", row.rate))
              if value is not None]
    return f"queue {row.name}: {', '.join(limits) or 'no limits'}"


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a URL-encoded form (the last of a repeated name); 400 when it is over
    ``MAX_FORM_BYTES`` or not URL-encoded UTF-8."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(400, f"the form is over {MAX_FORM_BYTES} bytes")
    try:
        return dict(parse_qsl(body.decode("ascii"), keep_blank_values=True, errors="strict"))
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "the form is not URL-encoded UTF-8") from None


def job_id_or_none(text: str) -> int | None:
    """The job id ``text`` spells in ASCII digits, within bigint; None otherwise (``'²'.isdigit()``
    is true, and ``int()`` of thousands of digits raises)."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_JOB_ID)):
        return None
    job_id = int(text)
    return job_id if 1 <= job_id <= MAX_JOB_ID else None


def path_job_id(request: Request) -> int:
    """The ``{job_id}`` of the path; 404 when no job can have it."""
    job_id = job_id_or_none(request.path_params["job_id"])
    if job_id is None:
        raise HTTPException(404, "no such job")
    return job_id


def create_app(dsn: str, *, token: str | None = None, action_token: str | None = None,
               token_hint: str = "--token", allowed_hosts: Sequence[str] | None = None) -> Starlette:
    """The dashboard over ``dsn``; ``token`` (if any) is required of every request; without
    one, pages are open and buttons need ``action_token`` (none: no button works), which
    ``token_hint`` says where to find; only ``allowed_hosts`` may be named in the Host header
    (None: any)."""
    board = Dashboard(dsn)
    routes = [
        Route("/", board.overview),
        Route("/live/overview", board.overview),
        Route("/search", board.search),
        Route("/bulk/{action}", board.bulk, methods=["POST"]),
        Route("/jobs/{job_id}", board.job),  # ids checked by path_job_id: 404, not a 500
        Route("/live/jobs/{job_id}", board.job),
        Route("/jobs/{job_id}/{action}", board.change, methods=["POST"]),
        Route("/queues/{action}", board.change_queue, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts or ["*"])),
        Middleware(AuthenticationMiddleware, backend=TokenAuth(token, action_token), on_error=unauthorized),
        Middleware(GuardedPosts, token_hint=token_hint),
    ]
    handlers = {404: board.not_found, 400: board.bad_request}
    return Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)
