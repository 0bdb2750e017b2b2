"""A wheel install carries the Alembic migrations, and gmd finds them without a source tree.

The migrations stay at the top of the source tree (migrations/); pyproject.toml's
[tool.setuptools.data-files] puts them in the wheel's data, which pip installs under
PREFIX/share/gmd/migrations. gmd.ledger_schema.migrate.migrations_dir() looks there after
$GMD_MIGRATIONS and the source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmd.ledger_schema import migrate

REPO = Path(__file__).resolve().parents[2]
DATA = "share/gmd/migrations"


def source_migrations() -> dict[str, bytes]:
    """The migration files a wheel must carry, by path relative to migrations/."""
    root = REPO / "migrations"
    files = [root / "env.py", root / "script.py.mako", *sorted(root.glob("versions/*.py"))]
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in files}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """A wheel built the way a user would (`pip wheel .`), from a copy of the tree.

    The copy keeps pip's build/ and *.egg-info out of the working tree. With build
    isolation, pip fetches the build backend (setuptools) from the package index.
    """
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for item in ("pyproject.toml", "gmd", "migrations", *os.listdir(REPO)):
        path = REPO / item
        if path.is_dir() and item in ("gmd", "migrations"):
            shutil.copytree(path, src / item, ignore=junk, dirs_exist_ok=True)
        elif path.is_file() and (
            item == "pyproject.toml"
            or item.startswith(("README", "LICENSE", "LICENCE", "NOTICE", "MANIFEST"))
        ):
            shutil.copy2(path, src / item)
    out = tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (built,) = out.glob("gmd-*.whl")
    with zipfile.ZipFile(built) as zf:
        yield zf


def data_dir(zf: zipfile.ZipFile) -> str:
    """The wheel's ``NAME-VERSION.data/data/`` prefix (what pip installs into PREFIX)."""
    (dist_info,) = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n}
    return dist_info.removesuffix(".dist-info") + ".data/data/"


def test_wheel_carries_every_migration(wheel: zipfile.ZipFile) -> None:
    prefix = data_dir(wheel) + DATA + "/"
    carried = {
        name.removeprefix(prefix): wheel.read(name)
        for name in wheel.namelist()
        if name.startswith(prefix)
    }
    want = source_migrations()
    assert sorted(carried) == sorted(want)
    assert carried == want  # byte for byte
    assert len([n for n in want if n.startswith("versions/")]) >= 4


def test_wheel_holds_only_the_package_and_its_data(wheel: zipfile.ZipFile) -> None:
    """No top-level `migrations` package or stray source files next to gmd/."""
    data = data_dir(wheel)
    tops = {
        name.split("/")[0]
        for name in wheel.namelist()
        if not name.startswith(data) and ".dist-info/" not in name
    }
    assert tops == {"gmd"}
    assert "gmd/ledger_schema/migrate.py" in wheel.namelist()


def test_wheel_carries_the_demo_traces(wheel: zipfile.ZipFile) -> None:
    """`gmd-admin demo` replays gmd/admin/demo_data from the installed package: every trace
    and its README, byte for byte (tests/integration/test_wheel_demo.py runs the demo from a
    wheel)."""
    root = REPO / "gmd" / "admin" / "demo_data"
    want = {f"gmd/admin/demo_data/{p.relative_to(root).as_posix()}": p.read_bytes()
            for p in root.rglob("*") if p.is_file()}  # fmt: skip
    carried = {n: wheel.read(n) for n in wheel.namelist() if n.startswith("gmd/admin/demo_data/")}
    assert sorted(carried) == sorted(want) and carried == want
    assert len([n for n in want if n.endswith(".csv.gz")]) == 100


def test_wheel_installs_the_systemd_units_entry_points(wheel: zipfile.ZipFile) -> None:
    """gmd-daemon and gmd-agent, which systemd/*.service start, are console scripts."""
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    for script, package in (
        ("gmd-daemon", "daemon"),
        ("gmd-agent", "agent"),
        ("gmd-admin", "admin"),
    ):
        assert f"{script} = gmd.{package}.cli:main" in text


# --- the extras: a compute host installs gmd[agent] and none of the daemon's libraries -----

# What a compute host must not need, by distribution name (tests/repository/test_layout.py has the
# import names); tests/integration/test_agent_install.py checks a real install against it too.
DAEMON_DISTRIBUTIONS = frozenset(
    {"sqlalchemy", "alembic", "fastapi", "uvicorn", "apscheduler", "matplotlib", "starlette"}
    | {"psycopg", "psycopg-binary", "openstacksdk", "httptools", "uvloop"}
)


def requirements_for(zf: zipfile.ZipFile, *extras: str) -> set[str]:
    """The distributions `pip install gmd[EXTRAS]` asks for by name, as the wheel's METADATA
    says (self-references such as gmd[daemon] followed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    (metadata,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
    lines = zf.read(metadata).decode().splitlines()
    requirements = [
        Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")
    ]
    wanted, todo, names = set(), ["", *extras], set()
    while todo:
        extra = todo.pop()
        if extra in wanted:
            continue
        wanted.add(extra)
        for req in requirements:
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if req.marker is None and extra:
                continue  # a base requirement, taken with extra ""
            if canonicalize_name(req.name) == "gmd":
                todo += sorted(req.extras)
            else:
                names.add(canonicalize_name(req.name))
    return names


def test_the_agent_extra_brings_none_of_the_daemons_libraries(wheel: zipfile.ZipFile) -> None:
    agent = requirements_for(wheel, "agent")
    assert {"libvirt-python", "pydantic", "httpx", "prometheus-client", "typer"} <= agent
    assert not agent & DAEMON_DISTRIBUTIONS, sorted(agent & DAEMON_DISTRIBUTIONS)
    daemon = requirements_for(wheel, "daemon")
    assert {"sqlalchemy", "alembic", "fastapi", "uvicorn", "apscheduler"} <= daemon
    assert "libvirt-python" not in daemon
    admin = requirements_for(wheel, "admin")
    assert daemon <= admin and "matplotlib" in admin and "libvirt-python" not in admin


def test_make_test_installs_every_extra() -> None:
    """tests/scripts/bootstrap.sh's default extras (what `make test` installs) name every extra."""
    import re
    import tomllib

    extras = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    (default,) = re.findall(
        r"^EXTRAS=\$\{GMD_EXTRAS:-([\w,]+)\}$",
        (REPO / "tests" / "scripts" / "bootstrap.sh").read_text(),
        re.M,
    )
    assert set(default.split(",")) == extras


def test_migrations_installed_from_the_wheel_are_found_and_run(
    wheel: zipfile.ZipFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lay the wheel's data out under a prefix as pip would; with no source tree and no
    GMD_MIGRATIONS, gmd finds them there and they build the whole schema."""
    prefix = tmp_path / "prefix"
    data = data_dir(wheel)
    for name in wheel.namelist():
        if name.startswith(data):
            target = prefix / name.removeprefix(data)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(wheel.read(name))
    monkeypatch.delenv("GMD_MIGRATIONS", raising=False)
    monkeypatch.setattr(migrate, "SOURCE_MIGRATIONS", tmp_path / "no-source-tree" / "migrations")
    monkeypatch.setattr(sys, "prefix", str(prefix))

    assert migrate.migrations_dir() == prefix / "share" / "gmd" / "migrations"
    engine = migrate.engine_for(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        migrate.upgrade(engine)
        assert migrate.current(engine) == migrate.head()
    finally:
        engine.dispose()
    installed_head = migrate.head()
    monkeypatch.undo()
    assert migrate.migrations_dir() == REPO / "migrations"
    assert installed_head == migrate.head()  # the same newest revision as the source tree


# --- the lookup on its own (no wheel) -----------------------------------------------------


def fake_migrations(path: Path) -> Path:
    (path / "versions").mkdir(parents=True)
    (path / "env.py").write_text("# env\n")
    return path


def test_source_tree_comes_before_installed_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkout (or editable install) uses its own migrations, not a stale installed copy."""
    monkeypatch.delenv("GMD_MIGRATIONS", raising=False)
    fake_migrations(tmp_path / "share" / "gmd" / "migrations")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert migrate.migrations_dir() == migrate.SOURCE_MIGRATIONS == REPO / "migrations"


def test_installed_prefix_is_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GMD_MIGRATIONS", raising=False)
    monkeypatch.setattr(migrate, "SOURCE_MIGRATIONS", tmp_path / "src" / "migrations")
    first, second = tmp_path / "venv", tmp_path / "usr-local"
    monkeypatch.setattr(migrate, "install_prefixes", lambda: [first, second])
    found = fake_migrations(second / "share" / "gmd" / "migrations")
    assert migrate.migrations_dir() == found
    # the earlier prefix wins once it has them too
    preferred = fake_migrations(first / "share" / "gmd" / "migrations")
    assert migrate.migrations_dir() == preferred


def test_install_prefixes_include_this_interpreters() -> None:
    import sysconfig

    prefixes = migrate.install_prefixes()
    assert prefixes[0] == Path(sys.prefix)
    assert Path(sysconfig.get_path("data")) in prefixes
    assert len(prefixes) == len(set(prefixes))


def test_gmd_migrations_overrides_and_is_the_only_place_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = fake_migrations(tmp_path / "mine")
    monkeypatch.setenv("GMD_MIGRATIONS", str(chosen))
    assert migrate.migrations_dir() == chosen
    # set but wrong: an error, not a quiet fallback to the source tree
    monkeypatch.setenv("GMD_MIGRATIONS", str(tmp_path / "typo"))
    with pytest.raises(FileNotFoundError) as err:
        migrate.migrations_dir()
    assert str(tmp_path / "typo") in str(err.value)
    assert str(REPO / "migrations") not in str(err.value)


def test_not_found_names_every_place_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GMD_MIGRATIONS", raising=False)
    monkeypatch.setattr(migrate, "SOURCE_MIGRATIONS", tmp_path / "src" / "migrations")
    prefixes = [tmp_path / "venv", tmp_path / "usr-local"]
    monkeypatch.setattr(migrate, "install_prefixes", lambda: prefixes)
    # a directory without env.py is not a migrations directory
    (prefixes[0] / "share" / "gmd" / "migrations" / "versions").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as err:
        migrate.migrations_dir()
    message = str(err.value)
    for place in (tmp_path / "src" / "migrations", *(p / DATA for p in prefixes)):
        assert str(place) in message
    assert "GMD_MIGRATIONS" in message
