"""Django tasks run by a real worker: ``shardworker run --app shardworker.contrib.django:app``
started as an operator starts it, counting runs from inside the tasks (a fsync'd ledger);
``get_result`` then reads what they returned or raised, and Django's connections are closed
around each task as its request cycle closes them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from tests.django.conftest import run_worker, start_worker
from tests.helpers import exit_code, query, wait_for, worker_log


def ledger(tmp_path: Path) -> list[dict[str, Any]]:
    """Every run the tasks recorded, in the order each process wrote them."""
    lines = []
    for path in sorted((tmp_path / "counts").glob("runs-*.log")):
        lines.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return lines


def place_orders(count: int) -> list[tuple[int, Any]]:
    """``count`` orders, each written with its receipt's task in one transaction."""
    from django.db import transaction
    from shop.models import Order
    from shop.tasks import send_receipt

    placed = []
    for n in range(count):
        with transaction.atomic():
            order = Order.objects.create(email=f"customer{n}@example.com")
            placed.append((order.id, send_receipt.enqueue(order.id)))
    return placed


def test_a_worker_runs_the_tasks_and_get_result_reads_what_they_returned(dsn: str, tmp_path: Path) -> None:
    from shop.models import Order
    from shop.tasks import charge, send_receipt, total

    placed = place_orders(3)
    failing = charge.enqueue(placed[0][0], 1999)
    summed = total.enqueue(1, 2, 3)
    assert run_worker(dsn, tmp_path) == 0, worker_log(tmp_path / "counts")

    runs = ledger(tmp_path)
    ran = sorted(run["id"] for run in runs)
    assert ran == sorted([result.id for _, result in placed] + [failing.id, summed.id]), "each task ran once"
    for order_id, enqueued in placed:
        result = send_receipt.get_result(enqueued.id)
        assert result.status == "SUCCESSFUL" and result.attempts == 1 and result.errors == []
        assert result.return_value == {"order": order_id, "sent_to": f"customer{order_id - placed[0][0]}@example.com",
                                       "lines": [1, 2]}
        assert result.finished_at >= result.started_at >= result.enqueued_at
    assert set(Order.objects.values_list("receipt_sent", flat=True)) == {True}

    failed = charge.get_result(failing.id)
    assert failed.status == "FAILED" and failed.attempts == 1 and len(failed.errors) == 1
    assert failed.errors[0].exception_class_path == "shop.tasks.PaymentDeclined"
    assert failed.errors[0].exception_class.__name__ == "PaymentDeclined"
    assert f"card refused for order {placed[0][0]} (1999 cents)" in failed.errors[0].traceback
    assert [run["attempt"] for run in runs if run["id"] == failing.id] == [1]  # MAX_ATTEMPTS defaults to 1

    async def read() -> Any:
        return await total.aget_result(summed.id)

    async_result = asyncio.run(read())
    assert async_result.status == "SUCCESSFUL" and async_result.return_value == {"total": 6}
    assert [run["orders"] for run in runs if run["id"] == summed.id] == [3]  # the async task's ORM call

    kinds = {row[0] for row in query(dsn, "SELECT kind FROM shardworker.jobs")}
    assert kinds == {"shop.tasks.send_receipt", "shop.tasks.charge", "shop.tasks.total"}  # one kind per task


def test_django_s_connections_are_closed_after_each_task(dsn: str, tmp_path: Path) -> None:
    """With Django's default CONN_MAX_AGE = 0, each task finds no connection open and opens its
    own (a new server process), as each request does; and it is closed when the task ends,
    not left open while the worker waits for the next."""
    from shop.tasks import send_receipt

    place_orders(3)
    assert run_worker(dsn, tmp_path) == 0, worker_log(tmp_path / "counts")
    runs = ledger(tmp_path)
    assert [run["closed_at_start"] for run in runs] == [True, True, True]
    assert len({run["backend_pid"] for run in runs}) == 3

    worker = start_worker(dsn, tmp_path)  # stays up: nothing else would close the connection
    last = place_orders(1)[0][1]
    wait_for(lambda: send_receipt.get_result(last.id).is_finished, 30, "the task to finish")
    pid = ledger(tmp_path)[-1]["backend_pid"]
    wait_for(lambda: not query(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", pid), 10,
             f"the task's connection (server process {pid}) to close")
    assert worker.poll() is None, "the worker is still up: the task closed its connection, not the exit"


def test_an_expired_connection_is_closed_before_the_next_task(dsn: str, tmp_path: Path) -> None:
    """With CONN_MAX_AGE = 1, a task ends with its connection young enough to keep; the next,
    started two seconds later, finds it expired, and the check before the task closes it."""
    from shop.tasks import send_receipt

    start_worker(dsn, tmp_path, env={"SW_DJANGO_CONN_MAX_AGE": "1"})
    first = place_orders(1)[0][1]
    wait_for(lambda: send_receipt.get_result(first.id).is_finished, 30, "the first task to finish")
    time.sleep(2)
    second = place_orders(1)[0][1]
    wait_for(lambda: send_receipt.get_result(second.id).is_finished, 30, "the second task to finish")
    runs = ledger(tmp_path)
    assert [run["closed_at_start"] for run in runs] == [True, True]
    assert runs[0]["backend_pid"] != runs[1]["backend_pid"]


def test_a_persistent_connection_is_kept_as_django_keeps_it(dsn: str, tmp_path: Path) -> None:
    """With CONN_MAX_AGE set, the checks around each task keep a healthy connection: the
    tasks share one, as a thread's requests do."""
    place_orders(3)
    assert run_worker(dsn, tmp_path, env={"SW_DJANGO_CONN_MAX_AGE": "600"}) == 0, worker_log(tmp_path / "counts")
    runs = ledger(tmp_path)
    assert [run["closed_at_start"] for run in runs] == [True, False, False]
    assert len({run["backend_pid"] for run in runs}) == 1


def test_an_async_task_s_connection_is_closed_at_its_end_whatever_conn_max_age(dsn: str, tmp_path: Path) -> None:
    """An async task's database work runs on a thread made for that task alone: a connection
    kept there could never serve another task, so it is closed when the task ends, even with
    CONN_MAX_AGE set (else each async task left one open until garbage collection)."""
    from shop.tasks import total

    worker = start_worker(dsn, tmp_path, env={"SW_DJANGO_CONN_MAX_AGE": "600"})
    results = [total.enqueue(n, 1) for n in range(3)]
    wait_for(lambda: all(total.get_result(r.id).is_finished for r in results), 30, "the async tasks to finish")
    pids = [run["backend_pid"] for run in ledger(tmp_path)]
    assert len(pids) == 3
    wait_for(lambda: not query(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", pids), 10,
             f"the async tasks' connections (server processes {pids}) to close")
    assert worker.poll() is None


def test_without_a_dsn_the_worker_runs_on_django_s_database(dsn: str, tmp_path: Path) -> None:
    """`run` with no --dsn takes the database Django's settings name (the backend's), never an
    embedded server of its own, which would hold none of the project's jobs."""
    from shop.tasks import send_receipt

    [(_, result)] = place_orders(1)
    worker = start_worker(dsn, tmp_path, "--exit-when-idle", give_dsn=False)
    assert exit_code(worker, 90, tmp_path / "counts") == 0, worker_log(tmp_path / "counts")
    assert send_receipt.get_result(result.id).status == "SUCCESSFUL"
    assert not (tmp_path / ".shardworker").exists() and "embedded" not in worker_log(tmp_path / "counts")


def test_the_worker_needs_the_settings_module(dsn: str, tmp_path: Path) -> None:
    code = run_worker(dsn, tmp_path, env={"DJANGO_SETTINGS_MODULE": ""})
    log = worker_log(tmp_path / "counts")
    assert code == 1 and "error: shardworker.contrib.django:app needs DJANGO_SETTINGS_MODULE" in log, log
