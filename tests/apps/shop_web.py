"""A FastAPI shop as a user writes one (docs/asgi.md): the order and its receipt job in one
transaction, a route that awaits a job's end, a route that streams a job's progress as
server-sent events. Served by uvicorn in a subprocess in tests/asgi."""

from __future__ import annotations

import os

from fastapi import FastAPI, HTTPException, Request

import shardworker
from shardworker.asgi import Lifespan, job_events, pool, transaction

app = FastAPI(lifespan=Lifespan(os.environ["SHOP_DSN"], max_size=4))


@app.post("/orders")
async def create_order(request: Request, email: str, fail: bool = False) -> dict[str, int]:
    async with transaction(request) as conn:
        cur = await conn.execute("INSERT INTO orders (email) VALUES (%s) RETURNING id", (email,))
        row = await cur.fetchone()
        assert row is not None
        job_id = await shardworker.enqueue_async(conn, "receipt", {"order": row[0], "email": email})
        if fail:  # after the enqueue: the rollback takes the order and its job
            raise HTTPException(500, "the order could not be saved")
    return {"order": row[0], "job": job_id}


@app.post("/reminders")
async def remind(request: Request, email: str) -> dict[str, int]:
    """The enqueue first, then a write that fails: the job goes with the rollback too."""
    async with transaction(request) as conn:
        job_id = await shardworker.enqueue_async(conn, "receipt", {"order": 0, "email": email})
        await conn.execute("INSERT INTO orders (email) VALUES (NULL)")  # NOT NULL: fails
    return {"job": job_id or 0}


@app.get("/jobs/{job_id}/result")
async def result(request: Request, job_id: int, timeout: float = 10.0) -> dict[str, object]:
    async with pool(request).connection() as conn:
        try:
            job = await shardworker.wait_for_async(conn, job_id, timeout_s=timeout)
        except shardworker.WaitTimeout:
            raise HTTPException(504, f"job {job_id} has not ended yet") from None
    return {"status": job.status, "result": job.result}


@app.get("/jobs/{job_id}/events")
async def follow(request: Request, job_id: int):  # type: ignore[no-untyped-def]
    return job_events(request, job_id, every_s=0.1)
