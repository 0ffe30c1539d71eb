"""The build configuration ships every package: pyproject.toml lists packages by name, so a
new package directory that is not listed would be left out of the wheel."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_in_the_build() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {".".join(init.parent.relative_to(REPO).parts) for root in ("shardworker", "outbox")
               for init in (REPO / root).rglob("__init__.py")}
    on_disk |= set(config.get("package-dir", {}))  # migrations/ ships as shardworker.migrations
    assert on_disk and listed == on_disk


def test_every_sql_file_is_package_data() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    data = config["package-data"]
    assert "*.sql" in data["shardworker.migrations"] and "*.sql" in data["shardworker.store.sql"]


def test_license_file_matches_the_declared_license() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"]["text"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert declared == "MIT" and text.startswith("MIT License\n")
    assert "Permission is hereby granted, free of charge" in text
