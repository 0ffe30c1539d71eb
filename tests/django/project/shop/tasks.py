"""The shop's tasks. Each run appends "result_id attempt" to a ledger file under
$SW_TEST_COUNT_DIR and fsyncs it before anything else (tests/apps/run_ledger.py's ledger), and
notes whether Django's connection was closed when it started."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

from shop.models import Order
from tests.apps.run_ledger import append

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


class PaymentDeclined(Exception):
    """The card was refused."""


def record(context: Any, **facts: Any) -> None:
    """One line for this run, durably: its result id, its attempt, and ``facts``."""
    append("runs", json.dumps({"id": context.task_result.id, "attempt": context.attempt, **facts}) + "\n")


@task(takes_context=True)
def send_receipt(context: Any, order_id: int) -> dict[str, Any]:
    closed_at_start = connection.connection is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend_pid = cursor.fetchone()[0]
    record(context, closed_at_start=closed_at_start, backend_pid=backend_pid)
    order = Order.objects.get(pk=order_id)
    order.receipt_sent = True
    order.save(update_fields=["receipt_sent"])
    return {"order": order_id, "sent_to": order.email, "lines": (1, 2)}


@task(takes_context=True)
def charge(context: Any, order_id: int, amount: int) -> None:
    record(context)
    raise PaymentDeclined(f"card refused for order {order_id} ({amount} cents)")


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@task(takes_context=True)
async def total(context: Any, *amounts: int) -> dict[str, int]:
    from asgiref.sync import sync_to_async

    orders = await Order.objects.acount()
    record(context, orders=orders, backend_pid=await sync_to_async(backend_pid)())
    return {"total": sum(amounts)}


@task(queue_name="mail", priority=50)
def newsletter(issue: str) -> str:
    return issue
