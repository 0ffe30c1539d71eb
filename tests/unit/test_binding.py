"""Which database an outbox belongs to (shardworker/core/binding.py), and whether it is the
embedded server's: ``outbox drain`` without --dsn trusts only that flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardworker.core import binding
from shardworker.core.config import WorkerConfig


class Identity:
    """A database's identity as the store reports it (the binding reads nothing else)."""

    def __init__(self, instance: str = "6eab3810-aaaa", database: str = "postgres",
                 server: str = "127.0.0.1:47031") -> None:
        self.triple = (instance, database, server)

    def identity(self) -> tuple[str, str, str]:
        return self.triple


def test_the_worker_marks_an_outbox_its_flusher_bound_first_as_embedded(tmp_path: Path) -> None:
    """The flusher and the parent bind at the same start; whichever writes first, an outbox of a
    no-DSN worker ends marked embedded (four of six were not, in a new user's trial)."""
    binding.bind(str(tmp_path), Identity())
    assert binding.bind(str(tmp_path), Identity(), embedded=True).embedded
    recorded = binding.bound_to(str(tmp_path))
    assert recorded is not None and recorded.embedded


def test_a_bind_without_the_flag_never_unmarks_it(tmp_path: Path) -> None:
    binding.bind(str(tmp_path), Identity(), embedded=True)
    binding.bind(str(tmp_path), Identity())
    recorded = binding.bound_to(str(tmp_path))
    assert recorded is not None and recorded.embedded


def test_the_flusher_knows_its_database_is_the_embedded_one() -> None:
    config = WorkerConfig(dsn="postgresql://127.0.0.1/postgres", app_ref="app:app", embedded_db=True)
    assert config.flusher_config().embedded_db


def test_an_outbox_of_another_schema_of_the_same_database_says_so(tmp_path: Path) -> None:
    """Same database and server, another instance: most likely another app's schema (--schema),
    which "point --dsn at the database it belongs to" would not mend."""
    binding.bind(str(tmp_path), Identity(instance="aaaa1111-app-a"))
    with pytest.raises(binding.WrongDatabase, match=r"another schema of the same database \(give the --schema"):
        binding.bind(str(tmp_path), Identity(instance="bbbb2222-app-b"))
    with pytest.raises(binding.WrongDatabase, match="point --dsn at the database it belongs to"):
        binding.bind(str(tmp_path), Identity(instance="cccc3333", database="other"))


def test_an_outbox_names_the_schema_it_belongs_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDWORKER_SCHEMA", "billing")
    binding.bind(str(tmp_path), Identity(instance="aaaa1111-app-a"))
    monkeypatch.setenv("SHARDWORKER_SCHEMA", "mail")
    with pytest.raises(binding.WrongDatabase, match=r"schema billing\), not .*schema mail\): give --schema billing"):
        binding.bind(str(tmp_path), Identity(instance="bbbb2222-app-b"))
