"""A shop's worker and its web side, both traced with the OpenTelemetry SDK as an application
configures it (tests/tracing/test_tracing.py copies this file into a project directory).

``python shop_tracing.py enqueue DSN`` is the web side: a ``checkout`` span, and inside it the
jobs it enqueues; ``shardworker run --app shop_tracing:app`` is the worker, whose startup hook
sets up the SDK in each child. Every process keeps its finished spans in memory (the SDK's
``InMemorySpanExporter``) and writes them to ``var/spans/<pid>.jsonl`` as it ends."""

from __future__ import annotations

import asyncio
import atexit
import os
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shardworker import App, Job, JobSpec, Retry, enqueue, enqueue_many

exporter = InMemorySpanExporter()
SPANS = Path("var/spans")


def trace_here() -> None:
    """The SDK with an in-memory exporter, as the application's startup would set it up."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    atexit.register(keep_spans)


def keep_spans() -> None:
    SPANS.mkdir(parents=True, exist_ok=True)
    with open(SPANS / f"{os.getpid()}.jsonl", "a") as out:
        for span in exporter.get_finished_spans():
            out.write(span.to_json(indent=None) + "\n")
    exporter.clear()


app = App()


@app.on_startup
def start_tracing() -> None:
    trace_here()


@app.on_shutdown
def stop_tracing() -> None:
    keep_spans()


@app.handler("order")
def order(job: Job) -> dict[str, object]:
    charged = job.step("charge", lambda: {"charged": job.payload["total"]})
    job.enqueue("receipt", {"order": job.payload["order"]})
    return {"order": job.payload["order"], **charged}


@app.handler("receipt")
def receipt(job: Job) -> str:
    return f"receipt for {job.payload['order']}"


@app.handler("flaky", max_attempts=5)
def flaky(job: Job) -> int:
    if job.attempt < 3:
        raise Retry(f"gateway busy ({job.attempt})", delay_s=0.2)
    return job.attempt


@app.handler("notify")
async def notify(job: Job) -> str:
    async def send() -> str:
        await asyncio.sleep(0.01)
        return "sent"

    return await job.step("send", send)


def web_side(dsn: str) -> None:
    trace_here()
    tracer = trace.get_tracer("shop.web")
    enqueue(dsn, "notify", {"to": "nobody"}, tags=["untraced"])  # outside any span
    with tracer.start_as_current_span("checkout"):
        enqueue(dsn, "order", {"order": 1, "total": 30})
        enqueue(dsn, "flaky", {"order": 1})
        enqueue_many(dsn, [JobSpec("notify", {"to": "ana"}), JobSpec("notify", {"to": "bo"})])


if __name__ == "__main__":
    web_side(sys.argv[2])
