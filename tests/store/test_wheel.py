"""The wheel carries the schema: built from the repository and installed into a fresh virtual
environment, its ``shardworker migrate`` creates the whole schema on a real PostgreSQL.

The wheel is built from a copy of the repository's files (without ``build/``, where an
earlier in-tree build may have left files that no longer exist). The fresh environment has no
pip and no system site-packages: installing the dependencies into it would need a package
index (tens of seconds here, and no network on some machines). It sees the dependencies
already installed for these tests through a ``.pth`` file naming their site-packages
directories. A path line in a ``.pth`` file only appends that directory to ``sys.path``,
after the environment's own site-packages, and the ``.pth`` files inside it are not run, so
an editable install of the repository is not active there; the test checks that
``shardworker`` and its migrations are imported from the environment's own site-packages,
and runs the command from a directory outside the repository.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = sorted(p.name for p in (REPO / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))
NOT_BUILD_INPUTS = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
                                          ".hypothesis", ".shardworker", "tests", "bench", "docs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel`` builds from a clean copy of the repository."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(REPO, source, ignore=NOT_BUILD_INPUTS)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "out"),
                            str(source)], capture_output=True, text=True, timeout=180)
    if built.returncode != 0 and "No module named pip" in built.stderr:
        pytest.skip("pip is not installed for this interpreter: cannot build the wheel")
    if built.returncode != 0 and "satisfies the requirement setuptools" in built.stderr:
        pytest.skip(f"the build backend (setuptools) cannot be installed here: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stderr
    (found,) = (work / "out").glob("shardworker-*.whl")
    return found


@pytest.fixture
def environment(wheel: Path, tmp_path: Path) -> Iterator[Path]:
    """A fresh virtual environment with only the wheel installed (the dependencies are seen)."""
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    paths = {"base": str(env_dir), "platbase": str(env_dir)}
    purelib = Path(sysconfig.get_path("purelib", vars=paths))
    dependencies = [*site.getsitepackages(), site.getusersitepackages()]
    (purelib / "_test_dependencies.pth").write_text("".join(f"{d}\n" for d in dependencies))
    python = Path(sysconfig.get_path("scripts", vars=paths)) / "python"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=120,
                               cwd=tmp_path, env=_clean_env())
    assert installed.returncode == 0, installed.stderr
    yield env_dir


def _clean_env() -> dict[str, str]:
    """This process's environment without what would point Python at the repository."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


def test_wheel_lists_every_migration(wheel: Path) -> None:
    """Every migrations/*.sql is in the wheel, as shardworker/migrations/<name>."""
    assert len(MIGRATIONS) >= 7
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"shardworker/migrations/{name}" for name in MIGRATIONS} <= names
    assert not [n for n in names if n.startswith("shardworker/store/migrations/")]


def test_installed_wheel_migrates_a_fresh_database(environment: Path, empty_dsn: str, tmp_path: Path) -> None:
    """The installed command applies every migration file from the wheel's own copy, and the
    ledger (shardworker.migrations) lists each of them."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paths = {"base": str(environment), "platbase": str(environment)}
    scripts = Path(sysconfig.get_path("scripts", vars=paths))
    own = Path(sysconfig.get_path("purelib", vars=paths)).resolve()
    where = subprocess.run([str(scripts / "python"), "-c", "import shardworker, importlib.resources as r; "
                            "print(shardworker.__file__); print(r.files('shardworker.migrations'))"],
                           capture_output=True, text=True, timeout=60, cwd=elsewhere, env=_clean_env())
    assert where.returncode == 0, where.stderr
    package, migrations = (Path(line).resolve() for line in where.stdout.splitlines())
    assert package == own / "shardworker" / "__init__.py"
    assert migrations == own / "shardworker" / "migrations"

    result = subprocess.run([str(scripts / "shardworker"), "migrate", "--dsn", empty_dsn], capture_output=True,
                            text=True, timeout=60, cwd=elsewhere, env=_clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"applied {len(MIGRATIONS)} migration(s): {', '.join(MIGRATIONS)}\n"
    with psycopg.connect(empty_dsn, connect_timeout=5) as conn:
        ledger = conn.execute("SELECT version, name FROM shardworker.migrations ORDER BY version").fetchall()
    assert ledger == [(int(name[:4]), name) for name in MIGRATIONS]
