"""Edges of a traced run, in a process of its own with the SDK set up (a test process must not
set the global tracer provider): prints one JSON object of what happened, for
tests/tracing/test_tracing_edges.py."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shardworker import App, Job
from shardworker.child.handlers import attempt_sync
from shardworker.core.model import ClaimedJob

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

app = App()


@app.handler("ok")
def ok(job: Job) -> str:
    return "ok"


@app.handler("boom", max_attempts=1)
def boom(job: Job) -> None:
    raise ValueError("boom")


@app.handler("leaves")
def leaves(job: Job) -> None:
    raise SystemExit(3)


HOSTILE = ['{"carrier": {"traceparent": 5}}', '{"carrier": {"baggage": 5}}', '{"carrier": 7}', "[1]", "not json",
           '{"runs": 7}', '{"runs": ["zz", 5, "00-ab-cd-01", "00-' + "f" * 40 + '-' + "1" * 16 + '-01"]}']


def main() -> None:
    found: dict[str, object] = {}
    found["hostile"] = [attempt_sync(app, ClaimedJob(n + 1, "ok", "default", "{}", 1, 3, trace_json=text)
                                     ).outcome.disposition.value for n, text in enumerate(HOSTILE)]
    found["hostile_spans"] = len(exporter.get_finished_spans())
    exporter.clear()
    last = attempt_sync(app, ClaimedJob(50, "boom", "default", "{}", 1, 1)).outcome
    again = attempt_sync(app, ClaimedJob(51, "boom", "default", "{}", 1, 3)).outcome
    spans = exporter.get_finished_spans()
    found["last"] = [last.disposition.value, last.extras_json is not None,
                     spans[0].attributes["shardworker.job.outcome"]]
    found["again"] = [again.disposition.value, json.loads(again.extras_json or b"{}").get("trace", "")[:3],
                      spans[1].attributes["shardworker.job.outcome"]]
    found["schema"] = spans[1].attributes.get("shardworker.schema")
    exporter.clear()
    try:
        attempt_sync(app, ClaimedJob(60, "leaves", "default", "{}", 1, 3))
    except SystemExit as exc:
        found["exit"] = exc.code
    (span,) = exporter.get_finished_spans()
    found["interrupted"] = [span.attributes["shardworker.job.outcome"], span.status.status_code.name,
                            [event.name for event in span.events]]
    print(json.dumps(found))


if __name__ == "__main__":
    main()
