"""OpenTelemetry traces, when the application records them.

shardworker needs nothing of OpenTelemetry: tracing is on in a process exactly when that
process has imported ``opentelemetry.trace`` (the application configured an SDK, or an
instrumentation did) and set a tracer provider other than the API's default. Otherwise every
call here is a lookup in ``sys.modules`` and returns at once: nothing imported, no span, no
column written. The worker uses whatever SDK, sampler and exporter the application set up
(in a child, its ``app.on_startup`` hook is the place); it never configures one itself.

What a traced job records:

* At enqueue (``carrier``), the current context as the application's propagator writes it
  (W3C ``traceparent`` and ``tracestate`` by default), kept with the job (``jobs.trace``,
  migration 0027: ``{"carrier": {...}}``).
* Each attempt's run (``Run``) is a ``CONSUMER`` span ``run <kind>`` whose parent is that
  context, so the run continues the enqueuer's trace, with the job's id, kind, queue and
  attempt, and its outcome when it ends (``shardworker.job.outcome``: done, retry, failed,
  cancelled, snoozed, suspended; ``interrupted`` when something else stopped it, such as
  the worker's event loop going away); a failed attempt's span has an error status and the
  exception. An attempt that ends to run again (a retry, a snooze, a wait) leaves its span's
  ``traceparent`` with its outcome; the flusher adds it to the job's ``"runs"`` (the newest
  32), and each later run links to those spans.
* Each step a handler runs (not one an earlier attempt recorded) is an ``INTERNAL`` span
  ``step <name>`` inside the run, and each follow-up job (``job.enqueue``) a ``PRODUCER`` span
  ``enqueue <kind>`` whose context the follow-up carries: its run continues from there.

Tracing never fails a job: an error of the SDK or the propagator, or a ``trace`` column an
application wrote by hand, is logged once and the run goes on untraced. A child exports what
its span processors still hold before it exits (``flush``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from shardworker.core.model import ClaimedJob, Disposition, Outcome, dumps_exact, loads_exact

if TYPE_CHECKING:
    from types import ModuleType

TRACER = "shardworker"
MAX_RUNS = 32  # earlier runs a job's trace keeps (jobs.trace "runs"), so a retry links to them
AGAIN = (Disposition.RETRY, Disposition.SNOOZED, Disposition.SUSPENDED)  # outcomes after which it runs again
_OFF: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
FLUSH_MS = 2000  # how long a child waits at its end for the spans the app's processors still hold
log = logging.getLogger(__name__)
_tracers: dict[int, Any] = {}  # the tracer of each provider seen (by id), made once
_warned: set[str] = set()
_UNREAD = object()
# A provider named in the environment, which the API loads at its first use.
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def api() -> ModuleType | None:
    """``opentelemetry.trace`` when this process traces (imported, and a provider set), else None."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    # The API's global, read directly: get_tracer_provider() looks up the environment on every
    # call (microseconds, per run and per enqueue) until a provider is set.
    provider = getattr(trace, "_TRACER_PROVIDER", _UNREAD)
    if provider is None and not _PROVIDER_FROM_ENV:
        return None  # none set: the API's default, which records nothing
    if provider is None or provider is _UNREAD:
        provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return trace


def _failed(what: str, exc: Exception) -> None:
    """Tracing never fails a job: what went wrong is logged once per place, and the run goes on
    untraced (a trace column an application wrote by hand, a propagator that raises)."""
    if what not in _warned:
        _warned.add(what)
        log.warning("tracing: %s failed (%s: %s); runs go on, untraced where this happens", what,
                    type(exc).__name__, exc)


def _tracer(trace: ModuleType) -> Any:
    provider = trace.get_tracer_provider()
    tracer = _tracers.get(id(provider))
    if tracer is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            release: str | None = version("shardworker")
        except PackageNotFoundError:
            release = None
        tracer = _tracers[id(provider)] = provider.get_tracer(TRACER, release)
    return tracer


def carrier() -> str | None:
    """The job's ``trace`` (JSON text) for an enqueue made now: the current context, as the
    application's propagator writes it; None when nothing is traced here."""
    trace = api()
    if trace is None:
        return None
    try:
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        from opentelemetry import propagate

        found: dict[str, str] = {}
        propagate.inject(found)
        return orjson.dumps({"carrier": found}).decode() if found else None
    except Exception as exc:  # the job is enqueued, untraced
        _failed("keeping the trace context at enqueue", exc)
        return None


def flush() -> None:
    """Export what the application's span processors still hold (a batch processor's queue),
    at most ``FLUSH_MS``: a child ends with ``os._exit``, where no ``atexit`` of the SDK runs."""
    trace = api()
    if trace is None:
        return
    try:
        force = getattr(trace.get_tracer_provider(), "force_flush", None)
        if force is not None:
            force(FLUSH_MS)
    except Exception as exc:
        _failed("exporting the last spans", exc)


def traceparent(context: Any) -> str:
    """A span context as a W3C ``traceparent``."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _linked(trace: ModuleType, runs: list[Any]) -> list[Any]:
    """Links to the spans of earlier runs, from their ``traceparent``s (those it cannot read are left out)."""
    links = []
    for run in runs[-MAX_RUNS:]:
        parts: list[str] = run.split("-") if isinstance(run, str) else []
        try:
            trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
        except (IndexError, ValueError):
            continue
        context = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags))
        if context.is_valid:
            links.append(trace.Link(context, {"shardworker.link": "earlier attempt"}))
    return links


class Run:
    """The span of one attempt's run: ``Run.start(job)`` (None when nothing is traced), then
    ``with run.current():`` around the handler, then ``run.end(outcome, error)``."""

    def __init__(self, trace: ModuleType, span: Any) -> None:
        self.trace = trace
        self.span = span

    @classmethod
    def start(cls, job: ClaimedJob) -> Run | None:
        trace = api()
        if trace is None:
            return None
        try:
            return cls._start(trace, job)
        except Exception as exc:  # the job runs, untraced
            _failed(f"starting the span of a run (job {job.id}, {job.kind})", exc)
            return None

    @classmethod
    def _start(cls, trace: ModuleType, job: ClaimedJob) -> Run:
        saved: dict[str, Any] = {}
        if job.trace_json:
            try:
                loaded = orjson.loads(job.trace_json)
                saved = loaded if isinstance(loaded, dict) else {}
            except orjson.JSONDecodeError:
                saved = {}
        parent = None
        if isinstance(saved.get("carrier"), dict):
            from opentelemetry import propagate

            # Text keys and values only: the row may have been written by hand.
            found = {k: v for k, v in saved["carrier"].items() if isinstance(k, str) and isinstance(v, str)}
            parent = propagate.extract(found)
        runs = saved.get("runs")
        attributes = {"messaging.system": "shardworker", "shardworker.job.id": job.id,
                      "shardworker.job.kind": job.kind, "shardworker.job.queue": job.queue,
                      "shardworker.job.attempt": job.attempt}
        schema = os.environ.get("SHARDWORKER_SCHEMA")  # (the worker's, inherited: several apps on one database)
        if schema:
            attributes["shardworker.schema"] = schema
        span = _tracer(trace).start_span(
            f"run {job.kind}", context=parent, kind=trace.SpanKind.CONSUMER,
            links=_linked(trace, runs) if isinstance(runs, list) else None, attributes=attributes)
        return cls(trace, span)

    def current(self) -> contextlib.AbstractContextManager[Any]:
        """The run's span as the current one, for the handler and what it calls."""
        return self.trace.use_span(self.span, end_on_exit=False, record_exception=False,
                                   set_status_on_exception=False)

    def end(self, job: ClaimedJob, outcome: Outcome, error: BaseException | None) -> Outcome:
        """End the span with ``outcome``; the outcome, carrying the span's ``traceparent`` in
        its extras when the job runs again (for the next run's link). A failed attempt that
        was the job's last is ``failed``, as its row will say, and carries nothing."""
        last = outcome.disposition is Disposition.RETRY and job.attempts_used >= job.max_attempts
        try:
            self.span.set_attribute("shardworker.job.outcome", "failed" if last else outcome.disposition.value)
            if outcome.disposition in (Disposition.RETRY, Disposition.FAILED):
                if error is not None:
                    self.span.record_exception(error)
                self.span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, (outcome.error or "")[:1024]))
            self.span.end()
            if outcome.disposition not in AGAIN or last:
                return outcome
            extras = loads_exact(outcome.extras_json.decode("utf-8")) if outcome.extras_json else {}
            extras["trace"] = traceparent(self.span.get_span_context())
            return replace(outcome, extras_json=dumps_exact(extras))
        except Exception as exc:
            _failed(f"ending the span of a run (job {job.id}, {job.kind})", exc)
            return outcome

    def interrupted(self, exc: BaseException) -> None:
        """End the span of a run that something other than its handler stopped (its event loop
        went away, a ``SystemExit``): outcome ``interrupted``, with the exception."""
        try:
            self.span.set_attribute("shardworker.job.outcome", "interrupted")
            self.span.record_exception(exc)
            self.span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, type(exc).__name__))
            self.span.end()
        except Exception as error:
            _failed("ending the span of an interrupted run", error)


def step(name: str) -> contextlib.AbstractContextManager[Any]:
    """A step's span (``step <name>``, inside the run), or nothing when nothing is traced."""
    trace = api()
    if trace is None:
        return _OFF
    try:
        return _tracer(trace).start_as_current_span(
            f"step {name}", kind=trace.SpanKind.INTERNAL, attributes={"shardworker.step.name": name})
    except Exception as exc:
        _failed("starting the span of a step", exc)
        return _OFF


def followup(kind: str, queue: str) -> str | None:
    """A follow-up's ``trace`` (JSON text): the context of an ``enqueue <kind>`` span made
    now, inside the run; None when nothing is traced."""
    trace = api()
    if trace is None:
        return None
    try:
        with _tracer(trace).start_as_current_span(
                f"enqueue {kind}", kind=trace.SpanKind.PRODUCER,
                attributes={"messaging.system": "shardworker", "shardworker.job.kind": kind,
                            "shardworker.job.queue": queue}):
            return carrier()
    except Exception as exc:
        _failed("the span of a follow-up's enqueue", exc)
        return None

