"""An app with periodic jobs: one every second (six-field cron, seconds last), counted like
counting_app's handlers."""

from __future__ import annotations

from counting_app import record

from shardworker import App, Job

app = App()


@app.periodic("* * * * * *", kind="tick", payload={"from": "cron"})
def tick(job: Job) -> dict[str, object]:
    record(job)
    return {"payload": job.payload}


app.periodic("* * * * * */2", kind="tick", name="tick-every-2s", payload={"from": "cron2"})
