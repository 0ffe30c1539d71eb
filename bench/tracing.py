"""What tracing costs a run, by how the application uses OpenTelemetry (issue 45, 3).

Each state runs in a fresh process: a no-op sync handler's attempt (``attempt_sync``, the
child's whole per-job path above the pipe and the outbox), 200,000 times, then the same with
an enqueue's trace capture (``tracing.carrier``). States:

* ``none``: opentelemetry never imported (shardworker never imports it);
* ``api``: the API imported, no SDK set up (the default provider);
* ``sdk``: the SDK set up with a span processor that drops every span (what the SDK itself costs).

    python bench/tracing.py          # prints µs per run and per enqueue capture, each state
"""

from __future__ import annotations

import subprocess
import sys
import time

N = 200_000
STATES = ("none", "api", "sdk")


def measure(state: str) -> tuple[float, float]:
    if state in ("api", "sdk"):
        import opentelemetry.trace  # noqa: F401
    if state == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

        provider = TracerProvider()
        provider.add_span_processor(SpanProcessor())  # the base class: on_end does nothing
        trace.set_tracer_provider(provider)
    from shardworker import App
    from shardworker.child.handlers import attempt_sync
    from shardworker.core import tracing
    from shardworker.core.model import ClaimedJob

    app = App()
    app.handler("noop")(lambda job: None)
    job = ClaimedJob(1, "noop", "default", "{}", 1, 3)
    for _ in range(1000):
        attempt_sync(app, job)
    started = time.perf_counter()
    for _ in range(N):
        attempt_sync(app, job)
    per_run = (time.perf_counter() - started) / N * 1e6
    started = time.perf_counter()
    for _ in range(N):
        tracing.carrier()
    per_capture = (time.perf_counter() - started) / N * 1e6
    return per_run, per_capture


def main() -> None:
    if len(sys.argv) > 1:
        run, capture = measure(sys.argv[1])
        print(f"{run:.3f} {capture:.3f}")
        return
    print(f"{'state':6} {'µs per run':>12} {'µs per enqueue capture':>24}")
    for state in STATES:
        out = subprocess.run([sys.executable, __file__, state], capture_output=True, text=True, check=True).stdout
        run, capture = out.split()
        print(f"{state:6} {float(run):12.3f} {float(capture):24.3f}")


if __name__ == "__main__":
    main()
