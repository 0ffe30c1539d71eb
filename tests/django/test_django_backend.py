"""The Django tasks backend in a Django process, on PostgreSQL: an enqueue lands with the
transaction it was made in, or not at all; Django's priority, queue and run_after map as
docs/django.md says; bad options and tasks are refused in one line; results read back."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from tests.helpers import query


def job_rows(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT id, kind, queue, priority, max_attempts, payload, status FROM shardworker.jobs "
                      "ORDER BY id")


def order_count(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM shop_order")[0][0])


def test_an_enqueue_in_a_committed_transaction_lands_with_the_model_row(dsn: str) -> None:
    from django.db import transaction
    from shop.models import Order
    from shop.tasks import send_receipt

    with transaction.atomic():
        order = Order.objects.create(email="ana@example.com")
        result = send_receipt.enqueue(order.id)
        assert job_rows(dsn) == [], "another session sees the job before the commit"
    rows = job_rows(dsn)
    assert rows == [(int(result.id), "shop.tasks.send_receipt", "default", 0, 1,
                     {"args": [order.id], "kwargs": {}}, "queued")]
    assert order_count(dsn) == 1
    assert result.status == "READY" and result.backend == "default" and result.args == [order.id]


def test_a_result_reads_back_inside_the_transaction_that_enqueued_it(dsn: str) -> None:
    """Inside atomic() (and so in every Django TestCase) the job exists for that transaction
    only: get_result reads it there, on Django's connection, with its payload as JSON."""
    from django.db import connection, transaction
    from shop.models import Order
    from shop.tasks import send_receipt

    with transaction.atomic():
        order = Order.objects.create(email="ana@example.com")
        result = send_receipt.enqueue(order.id)
        again = send_receipt.get_result(result.id)
        assert again.status == "READY" and again.args == [order.id] and again.kwargs == {}
        result.refresh()
        assert result.status == "READY"
        with connection.cursor() as cursor:  # Django's own loaders stay as Django set them
            cursor.execute("SELECT '{\"a\": 1}'::jsonb")
            assert cursor.fetchone()[0] == '{"a": 1}'


def test_a_rolled_back_transaction_leaves_neither_the_row_nor_the_job(dsn: str) -> None:
    from django.db import transaction
    from shop.models import Order
    from shop.tasks import send_receipt

    with pytest.raises(RuntimeError, match="declined"), transaction.atomic():
        order = Order.objects.create(email="ana@example.com")
        send_receipt.enqueue(order.id)
        raise RuntimeError("declined")
    assert job_rows(dsn) == [] and order_count(dsn) == 0


def test_an_enqueue_that_opens_the_transaction_rolls_back_with_it(dsn: str) -> None:
    """atomic() sends BEGIN only with its first statement: the enqueue is that statement here,
    and it must join the block, not commit on its own."""
    from django.db import transaction
    from shop.models import Order
    from shop.tasks import send_receipt

    with pytest.raises(RuntimeError), transaction.atomic():
        send_receipt.enqueue(1)
        Order.objects.create(email="ana@example.com")
        raise RuntimeError("changed my mind")
    assert job_rows(dsn) == [] and order_count(dsn) == 0


def test_a_savepoint_rolled_back_takes_its_job_and_the_outer_block_commits(dsn: str) -> None:
    from django.db import transaction
    from shop.models import Order
    from shop.tasks import newsletter, send_receipt

    with transaction.atomic():
        order = Order.objects.create(email="ana@example.com")
        kept = send_receipt.enqueue(order.id)
        with pytest.raises(RuntimeError), transaction.atomic():
            newsletter.enqueue("spring")
            raise RuntimeError("not this one")
    assert [(row[0], row[1]) for row in job_rows(dsn)] == [(int(kept.id), "shop.tasks.send_receipt")]
    assert order_count(dsn) == 1


def test_an_enqueue_in_autocommit_commits_at_once(dsn: str) -> None:
    from django.db import connection
    from shop.tasks import send_receipt

    assert connection.get_autocommit()
    result = send_receipt.enqueue(7)
    assert [row[0] for row in job_rows(dsn)] == [int(result.id)]
    assert connection.connection.info.transaction_status.name == "IDLE"  # nothing left open


def test_priority_queue_and_run_after_map_to_the_job(dsn: str) -> None:
    from shop.tasks import newsletter, send_receipt

    later = dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    urgent = newsletter.enqueue("spring")  # queue_name="mail", priority=50 in its @task
    deferred = send_receipt.using(priority=-100, run_after=later).enqueue(1)
    rows = {row[0]: row for row in query(dsn, "SELECT id, queue, priority, run_at FROM shardworker.jobs")}
    assert rows[int(urgent.id)][1:3] == ("mail", -50)  # Django: larger first; shardworker: smaller first
    assert rows[int(deferred.id)][1:] == ("default", 100, later)


def test_a_naive_run_after_is_read_in_django_s_time_zone(dsn: str, settings_override: Any) -> None:
    from shop.tasks import send_receipt

    with settings_override(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        result = send_receipt.using(run_after=dt.datetime(2031, 7, 1, 12, 0)).enqueue(1)
    run_at = query(dsn, "SELECT run_at FROM shardworker.jobs WHERE id = %s", int(result.id))[0][0]
    assert run_at == dt.datetime(2031, 7, 1, 10, 0, tzinfo=dt.UTC)  # noon in Paris, summer time


@pytest.fixture
def settings_override() -> Any:
    from django.test import override_settings

    return override_settings


def test_a_task_no_worker_imports_is_refused(dsn: str) -> None:
    from shop.helpers import stray

    from shardworker.contrib.django.api import InvalidTask

    with pytest.raises(InvalidTask, match="in no module the worker imports"):
        stray.enqueue()
    assert job_rows(dsn) == []


def test_arguments_json_cannot_hold_are_refused_before_anything_is_sent(dsn: str) -> None:
    from shop.tasks import send_receipt

    from shardworker.contrib.django.api import InvalidTask

    with pytest.raises(TypeError):
        send_receipt.enqueue(dt.date(2030, 1, 1))
    with pytest.raises(InvalidTask, match="64 bits"):
        send_receipt.enqueue(2**70)
    with pytest.raises(InvalidTask, match="not valid for backend"):
        send_receipt.using(queue_name="nowhere").enqueue(1)
    assert job_rows(dsn) == []


def test_get_result_reads_a_queued_job_and_refuses_others(dsn: str) -> None:
    from shop.tasks import charge, send_receipt

    import shardworker
    from shardworker.contrib.django.api import TaskResultDoesNotExist

    result = send_receipt.enqueue(3)
    again = send_receipt.get_result(result.id)
    assert (again.id, again.status, again.args, again.errors, again.attempts) == (result.id, "READY", [3], [], 0)
    assert again.task.func is send_receipt.func and not again.is_finished
    other = shardworker.enqueue(dsn, "thumbnail", {"url": "a.png"})
    for missing in (str(other), "999999", "x1", "-1"):
        with pytest.raises(TaskResultDoesNotExist):
            send_receipt.get_backend().get_result(missing)
    with pytest.raises(Exception, match="Task does not match"):
        charge.get_result(result.id)


def test_aenqueue_and_aget_result_in_asyncio_code(dsn: str) -> None:
    from shop.tasks import total

    async def main() -> tuple[Any, Any]:
        enqueued = await total.aenqueue(1, 2, 3)
        return enqueued, await total.aget_result(enqueued.id)

    enqueued, read = asyncio.run(main())
    assert [(row[0], row[1], row[5]) for row in job_rows(dsn)] == [
        (int(enqueued.id), "shop.tasks.total", {"args": [1, 2, 3], "kwargs": {}})]
    assert read.status == "READY" and read.args == [1, 2, 3]


def test_with_a_dsn_of_its_own_the_job_is_not_in_django_s_transaction(dsn: str) -> None:
    from django.db import transaction
    from shop.tasks import send_receipt

    from shardworker.contrib.django import Backend

    backend = Backend("elsewhere", {"OPTIONS": {"DSN": dsn}})
    with pytest.raises(RuntimeError), transaction.atomic():
        backend.enqueue(send_receipt, [5], {})
        raise RuntimeError("rolled back")
    assert [row[1] for row in job_rows(dsn)] == ["shop.tasks.send_receipt"]


def test_a_backend_with_a_schema_of_its_own_enqueues_and_reads_there(dsn: str) -> None:
    """OPTIONS["SCHEMA"]: another app's schema on the same database (docs/operating.md)."""
    from shop.tasks import send_receipt

    from shardworker import using_schema
    from shardworker.contrib.django import Backend
    from shardworker.store.migrate import apply_migrations

    with using_schema("shop_jobs"):
        apply_migrations(dsn)
    backend = Backend("default", {"OPTIONS": {"DSN": dsn, "SCHEMA": "shop_jobs"}})
    result = backend.enqueue(send_receipt, [5], {})
    assert job_rows(dsn) == []  # not in the shardworker schema
    assert query(dsn, "SELECT id, kind FROM shop_jobs.jobs") == [(int(result.id), "shop.tasks.send_receipt")]
    assert backend.get_result(result.id).status == "READY"


@pytest.mark.parametrize(("options", "message"), [
    ({"DATABSE": "default"}, "TASKS['t']['OPTIONS']: unknown option 'DATABSE' (expected one of DATABASE, DSN, "),
    ({"DATABASE": "replica"}, "TASKS['t']['OPTIONS']['DATABASE']: 'replica' is not an alias of settings.DATABASES"),
    ({"DATABASE": "default", "DSN": "dbname=x"}, "give DATABASE (enqueue in Django's transaction) or DSN"),
    ({"DSN": ""}, "['DSN'] must be a PostgreSQL DSN string, got ''"),
    ({"MAX_ATTEMPTS": 0}, "['MAX_ATTEMPTS'] must be an integer from 1 to 2147483647, got 0"),
    ({"THREADS": "yes"}, "['THREADS'] must be True or False, got 'yes'"),
    ({"TASK_MODULES": "shop.jobs"}, "['TASK_MODULES'] must be a list of module names, got 'shop.jobs'"),
    ([], "TASKS['t']['OPTIONS'] must be a dict, got list"),
    ({"SCHEMA": "Shop"}, "TASKS['t']['OPTIONS']['SCHEMA']: 'Shop' is not a schema name"),
])
def test_bad_options_are_refused_in_one_line(dsn: str, options: Any, message: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from shardworker.contrib.django import Backend

    with pytest.raises(ImproperlyConfigured) as caught:
        Backend("t", {"OPTIONS": options})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_queue_name_shardworker_cannot_hold_is_refused(dsn: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from shardworker.contrib.django import Backend

    with pytest.raises(ImproperlyConfigured, match=r"TASKS\['t'\]\['QUEUES'\]: .*queue name"):
        Backend("t", {"QUEUES": ["default", "x" * 300]})


def test_the_database_dsn_reaches_django_s_database(dsn: str) -> None:
    from shardworker.contrib.django import database_dsn

    expected = query(dsn, "SELECT current_database()")[0][0]
    assert query(database_dsn("default"), "SELECT current_database()")[0][0] == expected
