"""Unit tests of ``shardworker.app``: registering handlers on an ``App`` with their policy, and
``load_app`` finding the App a ``MODULE[:ATTR]`` reference names."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardworker.app import App, load_app
from shardworker.errors import AppLoadError, ConfigError


def test_app_handler_registers_by_kind() -> None:
    """A decorated function is registered under its kind with its policy, and returned unchanged."""
    app = App()

    def fn(job: object) -> int:
        return 1

    assert app.handler("b.kind", max_attempts=3, timeout_s=2.0)(fn) is fn
    app.handler("a.kind")(fn)
    assert app.kinds == ["a.kind", "b.kind"]
    assert app.handlers["b.kind"].max_attempts == 3
    assert app.handlers["b.kind"].timeout_s == 2.0
    assert app.handlers["a.kind"].max_attempts is None


def test_app_handler_rejects_the_same_kind_twice() -> None:
    """Registering a second handler for a kind raises ConfigError naming the kind."""
    app = App()
    app.handler("dup")(lambda job: None)
    with pytest.raises(ConfigError, match="'dup' is registered twice"):
        app.handler("dup")(lambda job: None)


@pytest.mark.parametrize(("options", "message"), [
    ({"max_attempts": 0}, "max_attempts must be >= 1"),
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"timeout_s": -1.5}, "timeout_s must be a positive number"),
])
def test_app_handler_rejects_bad_policy(options: dict[str, float], message: str) -> None:
    """A non-positive max_attempts or timeout raises ConfigError at decoration time."""
    with pytest.raises(ConfigError, match=message):
        App().handler("k", **options)  # type: ignore[arg-type]


@pytest.fixture
def app_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path holding small modules for load_app."""
    (tmp_path / "sw_good_app.py").write_text(textwrap.dedent("""
        from shardworker import App
        app = App()
        other = App()
        not_an_app = 42
        empty = App()

        @app.handler("k")
        def k(job):
            return None

        @other.handler("o")
        def o(job):
            return None
    """))
    (tmp_path / "sw_broken_app.py").write_text("raise RuntimeError('broken on import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_load_app_returns_the_named_app(app_modules: Path) -> None:
    """MODULE loads ``app`` by default and MODULE:ATTR the named App."""
    assert load_app("sw_good_app").kinds == ["k"]
    assert load_app("sw_good_app:other").kinds == ["o"]


@pytest.mark.parametrize(("ref", "message"), [
    ("sw_no_such_module_xyz", "cannot import 'sw_no_such_module_xyz'"),
    ("sw_broken_app", "RuntimeError: broken on import"),
    ("sw_good_app:not_an_app", "sw_good_app:not_an_app is a int, not a shardworker App"),
    ("sw_good_app:missing", "module 'sw_good_app' has no attribute 'missing'"),
    ("sw_good_app:empty", "the App has no handlers"),
    (":app", "expected MODULE"),
    ("webapp/tasks.py", "is a path; give the module, as Python imports it: --app webapp.tasks"),
    ("tasks.py:worker_app", "--app tasks:worker_app"),
])
def test_load_app_raises_app_load_error(app_modules: Path, ref: str, message: str) -> None:
    """A bad module, a failing import, or an attribute that is not an App with handlers raises AppLoadError."""
    with pytest.raises(AppLoadError) as info:
        load_app(ref)
    assert message in str(info.value)


def test_a_project_module_named_like_an_installed_one_is_named_in_the_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """./email.py with an App: the standard library's email loads first (the project directory comes
    after installed modules), and the error says which file loaded and what to do."""
    (tmp_path / "email.py").write_text("from shardworker import App\napp = App()\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AppLoadError) as info:
        load_app("email")
    message = str(info.value)
    assert "email" in message and "__init__.py" in message and "rename" in message, message


def test_a_folder_of_data_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sw_reports_dir").mkdir()
    (tmp_path / "sw_reports_dir" / "q1.csv").write_text("a,b\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AppLoadError) as info:
        load_app("sw_reports_dir")
    assert "a folder without Python code" in str(info.value), str(info.value)
