"""Settings of the test project: PostgreSQL from $SW_DJANGO_DSN (the test's database, which
holds shardworker's schema too), and shardworker as the tasks backend."""

from __future__ import annotations

import importlib.util
import os

from psycopg.conninfo import conninfo_to_dict

_params = conninfo_to_dict(os.environ["SW_DJANGO_DSN"])

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["shop"]
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the django-tasks backport
    INSTALLED_APPS.append("django_tasks")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _params.pop("dbname"),
        "USER": _params.pop("user", ""),
        "PASSWORD": _params.pop("password", ""),
        "HOST": _params.pop("host", ""),
        "PORT": _params.pop("port", ""),
        "OPTIONS": _params,
        # 0 (Django's default): a connection lives for one request, or one task; the tests
        # that keep connections set $SW_DJANGO_CONN_MAX_AGE.
        "CONN_MAX_AGE": int(os.environ["SW_DJANGO_CONN_MAX_AGE"]) if os.environ.get("SW_DJANGO_CONN_MAX_AGE") else 0,
    },
}

TASKS = {
    "default": {
        "BACKEND": "shardworker.contrib.django.Backend",
        "QUEUES": ["default", "mail"],
    },
}
