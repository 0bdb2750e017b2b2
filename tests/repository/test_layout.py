"""The package's layout rules, checked by reading every module's imports with ``ast``.

gmd is packaged by the process that runs the code (the project's architecture notes):

- the agent (``gmd/agent/**`` and everything it reaches, e.g. ``gmd.wire``, ``gmd.common``)
  reaches nothing of ``gmd.daemon`` or ``gmd.admin`` and imports none of the daemon's
  libraries, so a compute host installs only ``gmd[agent]``;
- the daemon (``gmd/daemon/**`` and what it reaches) reaches nothing of ``gmd.agent`` or
  ``gmd.admin`` and never imports libvirt;
- the broker (``gmd/broker/**``, a federation's gmd-broker) reaches nothing of ``gmd.agent``,
  ``gmd.admin`` or ``gmd.daemon`` and never imports libvirt: what it shares with the daemon
  sits below both (``gmd.openstack``, ``gmd.ledger_schema``, ``gmd.common``);
- ``gmd.openstack`` (the one way of reaching OpenStack: the client, the Placement reader) and
  ``gmd.ledger_schema`` (the ledger's tables, its migrations' runner and engine) serve the
  daemon and the broker alike and reach nothing of ``gmd.daemon``, ``gmd.broker``,
  ``gmd.agent`` or ``gmd.admin``, and never libvirt;
- the simulator (``gmd/sim/**``) reaches nothing of ``gmd.daemon``, ``gmd.agent`` or
  ``gmd.broker``: it replays traces, it needs no ledger (gmd-admin runs it, so the cycle rule
  keeps it from gmd-admin);
- ``gmd.fairness`` imports nothing of gmd outside itself, and only numpy and the stdlib;
- ``gmd.common`` imports only the stdlib, typer (a dependency of all three programs: the
  options their command lines share) and itself;
- ``gmd.wire`` imports nothing of gmd but itself, and only pydantic, orjson and the stdlib;
- ``gmd.osc`` (the ``openstack fairness`` plugin) imports nothing of gmd but itself, and only
  cliff, osc-lib and the stdlib: it runs wherever ``openstack`` does;
- ``gmd.nova`` (the Nova scheduler weigher) imports nothing of gmd but itself and
  ``gmd.fairness``, and only numpy, the stdlib and what Nova's environment brings (nova,
  oslo.config, keystoneauth1): it is installed into nova-scheduler's;
- ``gmd.traces`` (the Bitbrains traces the agent replays and gmd-admin's demo deals) imports
  nothing of gmd but itself, and only numpy and the stdlib;
- inside the agent, the collectors (``gmd.agent.collect``) import nothing of ``gmd.agent``
  outside themselves but its ground floor (:data:`AGENT_GROUND_FLOOR`: the libvirt connection,
  the cgroup locator, the block devices), which imports nothing of ``gmd.agent`` but itself:
  the appliers, the loop and the command line build on both, never the other way;
- no import cycle between gmd's modules, nor between its parts (``gmd.agent``, ``gmd.sim``,
  ``gmd.admin``, …).

Every import counts, including the lazy ones inside functions and those guarded by
``try/except ImportError``, for the cycles too (a module that needs another only inside a
function still depends on it). Imports under ``if TYPE_CHECKING:`` never run: they may cross
between processes and reach any library, but they count for the cycles. ``from gmd.x import
y`` imports the module ``gmd.x.y`` when there is one, and importing
``gmd.x.y`` runs ``gmd/__init__.py`` and ``gmd/x/__init__.py`` first, so "reaches" follows
both. :func:`check_layout` takes a source root, so the tests below copy gmd/ into a temporary
directory, plant one bad import, and show the rule it breaks names the file, the line and
the import.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "gmd"

# The daemon's (and admin's) third-party libraries, by top-level import name.
DAEMON_LIBRARIES = frozenset(
    {
        "sqlalchemy",
        "fastapi",
        "starlette",
        "alembic",
        "apscheduler",
        "psycopg",
        "psycopg2",
        "matplotlib",
        "openstack",
        "keystoneauth1",
        "uvicorn",
        "httptools",
        "uvloop",
        "keystonemiddleware",
        "oslo_config",
        "oslo_context",
        "oslo_policy",
        "webob",
    }
)
# The openstack command line's plugin: what python-openstackclient brings, nothing of gmd's.
OSC_LIBRARIES = frozenset({"cliff", "osc_lib"})
# The Nova weigher runs inside nova-scheduler: what Nova brings, and gmd.fairness's numpy.
NOVA_LIBRARIES = frozenset({"nova", "oslo_config", "keystoneauth1", "numpy"})
AGENT_LIBRARIES = frozenset({"libvirt"})
FAIRNESS_LIBRARIES = frozenset({"numpy"})
TRACES_LIBRARIES = frozenset({"numpy"})
COMMON_LIBRARIES = frozenset({"typer"})
# pydantic's own dependencies (typing_extensions, annotated_types, pydantic_core) go with it.
WIRE_LIBRARIES = frozenset(
    {"pydantic", "pydantic_core", "annotated_types", "typing_extensions", "orjson"}
)
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
# What the agent's collectors and appliers alike stand on: modules of gmd.agent that import
# nothing of gmd.agent but each other (the collectors may import them, and nothing else of it).
AGENT_GROUND_FLOOR = ("gmd.agent.libvirt_conn", "gmd.agent.cgroups", "gmd.agent.disks")
# The programs: what the daemon and the broker share must reach none of them.
PROGRAMS = ("gmd.daemon", "gmd.broker", "gmd.agent", "gmd.admin")


# --- reading the imports -------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One imported module: where the import statement is, and what it brings in."""

    importer: str  # the importing module, e.g. "gmd.agent.loop"
    path: str  # its file, relative to the source root
    line: int
    target: str  # the module imported, resolved: "gmd.agent.client", "sqlalchemy.orm"
    statement: str  # the statement as written, for messages
    lazy: bool  # inside a function (runs when called, not when imported)
    typing: bool = False  # under `if TYPE_CHECKING:`: never runs, but still a dependency

    @property
    def top(self) -> str:
        return self.target.split(".")[0]

    @property
    def internal(self) -> bool:
        return self.top == PACKAGE

    def where(self) -> str:
        return f"{self.path}:{self.line}: `{self.statement}`"


@dataclass
class Module:
    name: str
    path: str
    is_package: bool
    imports: list[Import] = field(default_factory=list)


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def import_nodes(
    nodes: Iterable[ast.AST], lazy: bool = False, typing: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement, with whether it sits inside a function and whether it is only
    for type checkers (the body of ``if TYPE_CHECKING:``, whose ``else:`` runs).

    Walks down from the module (not ``ast.walk``) so that it knows when it is in a function
    and under ``if TYPE_CHECKING:``.
    """
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, lazy, typing
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            yield from import_nodes(node.body, lazy, True)
            yield from import_nodes(node.orelse, lazy, typing)
        else:
            inside = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from import_nodes(ast.iter_child_nodes(node), lazy or inside, typing)


def resolve_from(module: Module, name: str | None, level: int) -> str:
    """The absolute module named by ``from NAME import ...`` (relative imports resolved)."""
    if not level:
        return name or ""
    package = module.name.split(".")
    if not module.is_package:
        package = package[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join([*package, name] if name else package)


@dataclass(frozen=True)
class Statement:
    """One import statement as written, before its names are resolved against the tree."""

    line: int
    text: str
    lazy: bool
    names: tuple[str, ...]  # `import a.b, c` → ("a.b", "c"); `from x import y, z` → ("y", "z")
    module: str | None = None  # `from x import ...` → "x"; None for `import ...`
    level: int = 0  # the dots of a relative import
    typing: bool = False  # under `if TYPE_CHECKING:`


_parsed: dict[tuple[str, bytes], tuple[Statement, ...]] = {}


def statements(path: Path, source: bytes) -> tuple[Statement, ...]:
    """The import statements of one file; cached by content, so that checking many copies of
    the tree that differ in one file parses each file once."""
    key = (path.name, source)
    if key not in _parsed:
        tree = ast.parse(source, filename=str(path))
        found = []
        for node, lazy, typing in import_nodes(tree.body):
            names = tuple(alias.name for alias in node.names)
            text = ast.unparse(node)
            if isinstance(node, ast.Import):
                found.append(Statement(node.lineno, text, lazy, names, typing=typing))
            else:
                found.append(
                    Statement(node.lineno, text, lazy, names, node.module, node.level, typing)
                )
        _parsed[key] = tuple(found)
    return _parsed[key]


def read_modules(root: Path) -> dict[str, Module]:
    """Every module of the package under ``root`` with the modules it imports."""
    modules: dict[str, Module] = {}
    sources: dict[str, tuple[Statement, ...]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        name, is_package = module_name(root, path)
        modules[name] = Module(name, path.relative_to(root).as_posix(), is_package)
        sources[name] = statements(path, path.read_bytes())
    for name, found in sources.items():
        module = modules[name]
        for st in found:
            if st.module is None and not st.level:
                targets = list(st.names)
            else:
                base = resolve_from(module, st.module, st.level)
                # `from gmd.x import y` imports the module gmd.x.y when there is one (gmd.x's
                # __init__ runs first, as for any module of gmd.x), else takes y from gmd.x
                targets = [f"{base}.{n}" for n in st.names if f"{base}.{n}" in modules]
                if len(targets) < len(st.names):
                    targets.insert(0, base)
            module.imports += [
                Import(name, module.path, st.line, t, st.text, st.lazy, st.typing) for t in targets
            ]
    return modules


# --- the rules -----------------------------------------------------------------------------


def parents(name: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``name``: gmd.a.b → gmd, gmd.a."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def reach(modules: dict[str, Module], start: str, stop: Iterable[str] = ()) -> dict[str, list[str]]:
    """The gmd modules that importing any module of ``start`` can run, each with a chain of
    modules leading to it from ``start`` (lazy imports included). The packages in ``stop``
    are not entered: reaching them is the fault, what they import is beside the point."""
    chains: dict[str, list[str]] = {}
    # breadth first, so each chain is a shortest one
    todo = deque((name, [name]) for name in sorted(modules) if within(name, start))
    while todo:
        name, chain = todo.popleft()
        if name in chains or any(within(name, p) for p in stop):
            continue
        chains[name] = chain
        nexts = parents(name) + [
            i.target for i in modules[name].imports if i.internal and not i.typing
        ]
        for target in nexts:
            target = known(modules, target)
            if target and target not in chains:
                todo.append((target, [*chain, target]))
    return chains


def known(modules: dict[str, Module], target: str) -> str:
    """The module an import runs: ``import gmd.x.y`` names gmd.x.y; a name that is not a
    module of the tree (an attribute, a typo) stands for its package."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def via(chain: list[str]) -> str:
    return "" if len(chain) < 2 else " (reached " + " → ".join(chain) + ")"


def check_process(
    modules: dict[str, Module],
    process: str,
    what: str,
    forbidden_packages: list[str],
    forbidden_libraries: frozenset[str],
) -> list[str]:
    """``process``'s modules, and every gmd module they reach, import none of
    ``forbidden_packages`` (gmd subpackages) and none of ``forbidden_libraries``."""
    problems = []
    for name, chain in sorted(reach(modules, process, stop=forbidden_packages).items()):
        seen: set[int] = set()  # one message per statement
        for imp in reversed(modules[name].imports):  # `from gmd.x import y`: gmd.x.y first
            if imp.line in seen or imp.typing:
                continue
            banned = [p for p in forbidden_packages if within(imp.target, p)]
            if banned:
                problems.append(
                    f"{imp.where()}: {what} must reach nothing of {banned[0]}, "
                    f"but imports {imp.target}{via(chain)}"
                )
            elif imp.top in forbidden_libraries:
                problems.append(f"{imp.where()}: {what} must not import {imp.top}{via(chain)}")
            else:
                continue
            seen.add(imp.line)
    return sorted(problems)


def check_own_imports(
    modules: dict[str, Module],
    package: str,
    what: str,
    libraries: frozenset[str],
    also: tuple[str, ...] = (),
) -> list[str]:
    """``package``'s modules import nothing of gmd outside ``package`` (and the packages
    ``also`` names), and of the rest only the stdlib and ``libraries``."""
    problems = []
    for name, module in sorted(modules.items()):
        if not within(name, package):
            continue
        seen: set[int] = set()
        for imp in reversed(module.imports):
            if imp.line in seen or imp.typing:
                continue
            seen.add(imp.line)
            allowed_here = (package, *also)
            if (
                imp.internal
                and not any(within(imp.target, p) for p in allowed_here)
                and imp.target != PACKAGE
            ):
                outside = " and ".join(allowed_here)
                problems.append(
                    f"{imp.where()}: {what} must import nothing of gmd outside {outside}, "
                    f"but imports {imp.target}"
                )
            elif not imp.internal and imp.top not in STDLIB | libraries:
                allowed = ", ".join(["the stdlib", *sorted(libraries)])
                problems.append(
                    f"{imp.where()}: {what} may import only {allowed}, but imports {imp.top}"
                )
    return sorted(problems)


def check_floor(
    modules: dict[str, Module], package: str, what: str, within_part: str, allowed: Iterable[str]
) -> list[str]:
    """``package``'s modules (a package or one module) import nothing of ``within_part`` but
    ``package`` itself and the modules ``allowed`` (and the packages above them, whose
    ``__init__`` runs anyway). Imports for type checkers count too: a layer that knows the one
    above it, even for types, is a knot for a reader."""
    allowed_here = (package, *allowed)
    problems = []
    for name, module in sorted(modules.items()):
        if not within(name, package):
            continue
        seen: set[int] = set()
        for imp in reversed(module.imports):
            target = known(modules, imp.target)
            if imp.line in seen or not within(target, within_part):
                continue
            if any(within(target, p) for p in allowed_here) or target in parents(name):
                continue
            seen.add(imp.line)
            problems.append(
                f"{imp.where()}: {what} must import nothing of {within_part} but "
                f"{' and '.join(allowed_here)}, but imports {target}"
            )
    return sorted(problems)


def top_package(name: str) -> str:
    """The part of gmd a module belongs to: gmd.agent.collect.replay → gmd.agent."""
    return ".".join(name.split(".")[:2])


def import_cycles(
    modules: dict[str, Module], node: Callable[[str], str] = lambda name: name
) -> list[list[Import]]:
    """The cycles of the import graph between gmd modules, or between what ``node`` groups
    them into (the parts of gmd: :func:`top_package`): Tarjan's strongly connected
    components, then one cycle through each component. Every import counts, those for type
    checkers too: a cycle through them is still a knot for a reader and for a split."""
    edges: dict[str, dict[str, Import]] = {node(name): {} for name in modules}
    for name, module in modules.items():
        for imp in module.imports:
            target = known(modules, imp.target)
            if imp.internal and target and node(target) != node(name):
                edges[node(name)].setdefault(node(target), imp)

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)

    cycles = []
    for component in components:
        members = set(component)
        # the shortest way back to the component's first module, breadth first
        start = component[0]
        came_from: dict[str, Import] = {}
        frontier = [start]
        found: Import | None = None
        while frontier and found is None:
            following = []
            for v in frontier:
                for w, imp in sorted(edges[v].items()):
                    if w == start:
                        found = imp
                        break
                    if w in members and w not in came_from:
                        came_from[w] = imp
                        following.append(w)
                if found:
                    break
            frontier = following
        assert found is not None
        cycle = [found]
        while node(cycle[0].importer) != start:
            cycle.insert(0, came_from[node(cycle[0].importer)])
        cycles.append(cycle)
    return cycles


def check_cycles(modules: dict[str, Module]) -> list[str]:
    problems = []
    for cycle in import_cycles(modules):
        names = " → ".join([cycle[0].importer, *(imp.target for imp in cycle)])
        steps = "; ".join(imp.where() for imp in cycle)
        problems.append(f"{cycle[0].where()}: import cycle {names} ({steps})")
    for cycle in import_cycles(modules, top_package):
        names = " → ".join(
            [top_package(cycle[0].importer), *(top_package(i.target) for i in cycle)]
        )
        steps = "; ".join(imp.where() for imp in cycle)
        problems.append(f"{cycle[0].where()}: import cycle between packages {names} ({steps})")
    return problems


def check_layout(root: Path) -> list[str]:
    """Every broken layout rule of the gmd package under ``root``, one line each, starting
    with the file, the line and the import statement at fault."""
    modules = read_modules(root)
    return [
        *check_process(
            modules,
            "gmd.agent",
            "the agent",
            ["gmd.daemon", "gmd.admin"],
            DAEMON_LIBRARIES,
        ),
        *check_process(
            modules, "gmd.daemon", "the daemon", ["gmd.agent", "gmd.admin"], AGENT_LIBRARIES
        ),
        *check_process(
            modules,
            "gmd.broker",
            "the broker",
            ["gmd.agent", "gmd.admin", "gmd.daemon"],
            AGENT_LIBRARIES,
        ),
        *check_process(modules, "gmd.openstack", "gmd.openstack", list(PROGRAMS), AGENT_LIBRARIES),
        *check_process(
            modules, "gmd.ledger_schema", "gmd.ledger_schema", list(PROGRAMS), AGENT_LIBRARIES
        ),
        *check_process(
            modules,
            "gmd.sim",
            "the simulator",
            ["gmd.daemon", "gmd.agent", "gmd.broker"],
            frozenset(),
        ),
        *check_own_imports(modules, "gmd.fairness", "gmd.fairness", FAIRNESS_LIBRARIES),
        *check_own_imports(modules, "gmd.common", "gmd.common", COMMON_LIBRARIES),
        *check_own_imports(modules, "gmd.wire", "gmd.wire", WIRE_LIBRARIES),
        *check_own_imports(modules, "gmd.traces", "gmd.traces", TRACES_LIBRARIES),
        *check_own_imports(modules, "gmd.osc", "gmd.osc", OSC_LIBRARIES),
        *check_own_imports(modules, "gmd.nova", "gmd.nova", NOVA_LIBRARIES, ("gmd.fairness",)),
        *check_floor(
            modules, "gmd.agent.collect", "the collectors", "gmd.agent", AGENT_GROUND_FLOOR
        ),
        *(
            problem
            for floor in AGENT_GROUND_FLOOR
            for problem in check_floor(
                modules, floor, "the agent's ground floor", "gmd.agent", AGENT_GROUND_FLOOR
            )
        ),
        *check_cycles(modules),
    ]


# --- the tree as it is ---------------------------------------------------------------------


def test_the_package_keeps_its_layout() -> None:
    problems = check_layout(REPO)
    assert not problems, "layout rules broken:\n" + "\n".join(problems)


def test_the_checker_sees_the_whole_package() -> None:
    """A guard against a checker that passes because it reads nothing."""
    modules = read_modules(REPO)
    assert {"gmd.agent.cli", "gmd.daemon.cli", "gmd.admin.cli", "gmd.wire"} <= set(modules)
    agent = reach(modules, "gmd.agent")
    assert {"gmd.wire", "gmd.common.config", "gmd.agent.collect.libvirt"} <= set(agent)
    libraries = {i.top for m in agent for i in modules[m].imports}
    assert {"libvirt", "pydantic", "httpx"} <= libraries
    daemon_libraries = {i.top for m in reach(modules, "gmd.daemon") for i in modules[m].imports}
    assert {"sqlalchemy", "fastapi", "openstack"} <= daemon_libraries
    # the broker reaches what it shares with the daemon, below both
    broker = reach(modules, "gmd.broker")
    assert {"gmd.openstack.placement", "gmd.ledger_schema.tables", "gmd.common.config"} <= set(
        broker
    )
    # lazy imports are read (gmd.agent.cli picks its collector inside a function)
    assert any(i.lazy and i.internal for m in agent for i in modules[m].imports)


# --- each rule, broken on purpose in a copy of the tree -------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    shutil.copytree(REPO / PACKAGE, root / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def tree(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of gmd/ to plant bad imports in."""
    shutil.copytree(pristine / PACKAGE, tmp_path / PACKAGE)
    return tmp_path


def plant(root: Path, path: str, *lines: str) -> int:
    """Append ``lines`` to ``path`` (made if missing); the line number of the first."""
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    old = file.read_text() if file.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    file.write_text(old + "\n".join(lines) + "\n")
    return old.count("\n") + 1


def one_problem(root: Path, *expected: str) -> str:
    problems = check_layout(root)
    assert len(problems) == 1, "\n".join(problems)
    for text in expected:
        assert text in problems[0], problems[0]
    return problems[0]


BAD_PROCESS_IMPORTS = [
    # (file, the planted line, words the message must hold)
    ("gmd/agent/loop.py", "import sqlalchemy", ["the agent must not import sqlalchemy"]),
    ("gmd/agent/client.py", "from fastapi import FastAPI", ["must not import fastapi"]),
    ("gmd/agent/cli.py", "import matplotlib.pyplot as plt", ["must not import matplotlib"]),
    ("gmd/agent/spool.py", "from psycopg import sql", ["must not import psycopg"]),
    ("gmd/agent/sender.py", "import starlette.requests", ["must not import starlette"]),
    ("gmd/agent/collect/base.py", "import alembic", ["must not import alembic"]),
    ("gmd/agent/apply/limits.py", "import apscheduler", ["must not import apscheduler"]),
    ("gmd/agent/config.py", "import openstack", ["must not import openstack"]),
    ("gmd/agent/collect/counters.py", "import uvicorn", ["must not import uvicorn"]),
    (
        "gmd/agent/loop.py",
        "from gmd.daemon.ingest import store",
        ["the agent must reach nothing of gmd.daemon", "gmd.daemon.ingest.store"],
    ),
    (
        "gmd/agent/collect/replay.py",
        "from ...admin import output",  # relative, and `output` is a module
        ["the agent must reach nothing of gmd.admin", "gmd.admin.output"],
    ),
    ("gmd/daemon/ingest/store.py", "import libvirt", ["the daemon must not import libvirt"]),
    (
        "gmd/daemon/api/app.py",
        "from gmd.agent import spool",
        ["the daemon must reach nothing of gmd.agent", "gmd.agent.spool"],
    ),
    (
        "gmd/daemon/enforce/levels.py",
        "import gmd.admin.output",
        ["the daemon must reach nothing of gmd.admin"],
    ),
    (
        "gmd/sim/report.py",
        "from gmd.daemon.reports import standings",
        ["the simulator must reach nothing of gmd.daemon", "gmd.daemon.reports.standings"],
    ),
    (
        "gmd/broker/history.py",
        "from gmd.daemon.ingest import store",
        ["the broker must reach nothing of gmd.daemon", "gmd.daemon.ingest.store"],
    ),
    (
        "gmd/broker/config.py",
        "from gmd.daemon.config import load",
        ["the broker must reach nothing of gmd.daemon", "gmd.daemon.config"],
    ),
    (
        "gmd/broker/openstack.py",
        "import gmd.daemon.enforce.quotas",
        ["the broker must reach nothing of gmd.daemon", "gmd.daemon.enforce.quotas"],
    ),
    (
        "gmd/openstack/placement.py",
        "from gmd.broker import handlers",
        ["gmd.openstack must reach nothing of gmd.broker", "gmd.broker.handlers"],
    ),
    (
        "gmd/ledger_schema/tables.py",
        "from gmd.broker import coordination",
        ["gmd.ledger_schema must reach nothing of gmd.broker", "gmd.broker.coordination"],
    ),
]


@pytest.mark.parametrize(("path", "line", "expected"), BAD_PROCESS_IMPORTS)
def test_a_process_importing_the_other_sides_code_fails(
    tree: Path, path: str, line: str, expected: list[str]
) -> None:
    number = plant(tree, path, line)
    # The daemon importing gmd-admin, which imports the daemon, also knots the two packages:
    # that is the cycle rule's to say.
    problems = [p for p in check_layout(tree) if "import cycle between packages" not in p]
    assert len(problems) == 1, "\n".join(problems)
    for text in [f"{path}:{number}: `{line}`", *expected]:
        assert text in problems[0], problems[0]


SHARED_IMPORTING_A_PROGRAM = [
    # (file, the planted line, the message of the shared package's own rule). The programs
    # that reach the file break their rules too (the broker reaching gmd.daemon through
    # gmd.openstack): those messages come beside this one.
    (
        "gmd/openstack/client.py",
        "from gmd.daemon.enforce import quotas",
        "gmd.openstack must reach nothing of gmd.daemon, but imports gmd.daemon.enforce.quotas",
    ),
    (
        "gmd/openstack/placement.py",
        "from gmd.agent import spool",
        "gmd.openstack must reach nothing of gmd.agent, but imports gmd.agent.spool",
    ),
    (
        "gmd/openstack/client.py",
        "import gmd.admin.output",
        "gmd.openstack must reach nothing of gmd.admin, but imports gmd.admin.output",
    ),
    (
        "gmd/ledger_schema/migrate.py",
        "from gmd.daemon.ingest import store",
        "gmd.ledger_schema must reach nothing of gmd.daemon, but imports gmd.daemon.ingest.store",
    ),
]


@pytest.mark.parametrize(("path", "line", "expected"), SHARED_IMPORTING_A_PROGRAM)
def test_what_the_daemon_and_the_broker_share_imports_neither(
    tree: Path, path: str, line: str, expected: str
) -> None:
    number = plant(tree, path, line)
    # Importing what imports it back (the quotas import gmd.openstack's error) also knots the
    # modules: that is the cycle rule's to say.
    problems = [p for p in check_layout(tree) if "import cycle" not in p]
    assert f"{path}:{number}: `{line}`: {expected}" in problems, "\n".join(problems)
    assert all(p.startswith(f"{path}:{number}: `{line}`: ") for p in problems), problems


def test_a_lazy_import_inside_a_function_counts(tree: Path) -> None:
    number = plant(
        tree,
        "gmd/agent/spool.py",
        "def _later():",
        "    if True:",
        "        from sqlalchemy import create_engine",
        "        return create_engine",
    )
    one_problem(
        tree,
        f"gmd/agent/spool.py:{number + 2}: `from sqlalchemy import create_engine`",
        "must not import sqlalchemy",
    )


def test_an_import_guarded_by_try_counts(tree: Path) -> None:
    number = plant(
        tree, "gmd/agent/spool.py", "try:", "    import uvicorn", "except ImportError:", "    pass"
    )
    one_problem(tree, f"gmd/agent/spool.py:{number + 1}: `import uvicorn`", "must not import")


def test_an_import_under_type_checking_may_cross(tree: Path) -> None:
    plant(
        tree,
        "gmd/agent/loop.py",
        "import typing",
        "if typing.TYPE_CHECKING:",
        "    from gmd.daemon.ingest.store import LedgerStore",
        "    import sqlalchemy",
    )
    number = plant(
        tree,
        "gmd/daemon/cli.py",
        "if TYPE_CHECKING:",
        "    import libvirt",
        "else:",
        "    import libvirt",  # the else branch runs
    )
    one_problem(tree, f"gmd/daemon/cli.py:{number + 3}: `import libvirt`")


def test_what_the_agent_reaches_is_checked_too(tree: Path) -> None:
    """A shared module the agent imports may not bring the daemon's libraries in either:
    the message names the import at fault and how the agent gets there."""
    number = plant(tree, "gmd/sim/helpers.py", "import sqlalchemy")
    plant(tree, "gmd/agent/collect/aggregate.py", "from gmd.sim import helpers")
    problem = one_problem(tree, f"gmd/sim/helpers.py:{number}: `import sqlalchemy`")
    assert "gmd.agent.collect.aggregate → gmd.sim.helpers" in problem


def test_a_package_init_runs_before_its_modules(tree: Path) -> None:
    """Importing gmd.common.config runs gmd/__init__.py: what that imports, the agent reaches."""
    number = plant(tree, "gmd/__init__.py", "from gmd.admin import output")
    problems = check_layout(tree)
    assert any(
        p.startswith(f"gmd/__init__.py:{number}:")
        and "the agent must reach nothing of gmd.admin" in p
        for p in problems
    ), problems


BAD_OWN_IMPORTS = [
    (
        "gmd/fairness/decay.py",
        "from gmd.common.timespec import iso",
        ["gmd.fairness must import nothing of gmd outside gmd.fairness", "gmd.common.timespec"],
    ),
    (
        "gmd/fairness/policy.py",
        "import scipy.stats",
        ["gmd.fairness may import only the stdlib, numpy, but imports scipy"],
    ),
    (
        "gmd/common/logs.py",
        "import rich",
        ["gmd.common may import only the stdlib, typer, but imports rich"],
    ),
    (
        "gmd/common/config.py",
        "from gmd import wire",
        ["gmd.common must import nothing of gmd outside gmd.common", "gmd.wire"],
    ),
    (
        "gmd/wire.py",
        "from gmd.fairness import decay",
        ["gmd.wire must import nothing of gmd outside gmd.wire", "gmd.fairness.decay"],
    ),
    ("gmd/wire.py", "import numpy", ["gmd.wire may import only", "but imports numpy"]),
    (
        "gmd/nova/ranking.py",
        "from gmd.wire import PlanMode",
        ["gmd.nova must import nothing of gmd outside gmd.nova and gmd.fairness", "gmd.wire"],
    ),
    (
        "gmd/nova/source.py",
        "import httpx",
        ["gmd.nova may import only the stdlib, keystoneauth1, nova, numpy", "imports httpx"],
    ),
]


@pytest.mark.parametrize(("path", "line", "expected"), BAD_OWN_IMPORTS)
def test_the_shared_modules_keep_to_their_own_imports(
    tree: Path, path: str, line: str, expected: list[str]
) -> None:
    number = plant(tree, path, line)
    # The daemon importing gmd-admin, which imports the daemon, also knots the two packages:
    # that is the cycle rule's to say.
    problems = [p for p in check_layout(tree) if "import cycle between packages" not in p]
    assert len(problems) == 1, "\n".join(problems)
    for text in [f"{path}:{number}: `{line}`", *expected]:
        assert text in problems[0], problems[0]


BAD_FLOOR_IMPORTS = [
    (
        "gmd/agent/collect/host.py",
        "from gmd.agent.apply import limits",
        ["the collectors must import nothing of gmd.agent but gmd.agent.collect and"],
    ),
    (
        "gmd/agent/collect/lifecycle.py",
        "from gmd.agent.spool import Spool",
        ["the collectors must import nothing of gmd.agent", "but imports gmd.agent.spool"],
    ),
    (
        "gmd/agent/libvirt_conn.py",
        "from gmd.agent.collect.base import ReadFailure",  # the knot this rule undid
        ["the agent's ground floor must import nothing of gmd.agent", "gmd.agent.collect.base"],
    ),
    (
        "gmd/agent/cgroups.py",
        "from gmd.agent.apply import limits",
        ["the agent's ground floor must import nothing", "but imports gmd.agent.apply.limits"],
    ),
]


@pytest.mark.parametrize(("path", "line", "expected"), BAD_FLOOR_IMPORTS)
def test_the_collectors_stand_on_the_agents_ground_floor_alone(
    tree: Path, path: str, line: str, expected: list[str]
) -> None:
    number = plant(tree, path, line)
    problems = [p for p in check_layout(tree) if "import cycle" not in p]
    assert len(problems) == 1, "\n".join(problems)
    for text in [f"{path}:{number}: `{line}`", *expected]:
        assert text in problems[0], problems[0]


def test_the_ground_floor_may_import_itself_and_the_collectors_it(tree: Path) -> None:
    """The rule is not "nothing of gmd.agent": what it allows stays allowed."""
    plant(tree, "gmd/agent/collect/host.py", "from gmd.agent.cgroups import PROC")
    plant(tree, "gmd/agent/libvirt_conn.py", "from gmd.agent import disks")
    assert check_layout(tree) == []


def test_an_import_cycle_fails(tree: Path) -> None:
    number = plant(tree, "gmd/fairness/ranking.py", "from gmd.fairness import policy")
    uses = [
        imp
        for imp in read_modules(tree)["gmd.fairness.policy"].imports
        if imp.target == "gmd.fairness.ranking"
    ]
    if not uses:  # policy does not import ranking (any more): make the other half too
        plant(tree, "gmd/fairness/policy.py", "from gmd.fairness import ranking")
    problem = one_problem(tree, "import cycle", "gmd.fairness.policy", "gmd.fairness.ranking")
    assert f"gmd/fairness/ranking.py:{number}: `from gmd.fairness import policy`" in problem


def test_a_relative_import_cycle_through_a_package_fails(tree: Path) -> None:
    plant(tree, "gmd/sim/a.py", "from . import b")
    number = plant(tree, "gmd/sim/b.py", "def later():", "    from .a import thing")
    one_problem(tree, "import cycle", f"gmd/sim/b.py:{number + 1}: `from .a import thing`")


def test_an_import_cycle_through_type_checking_fails(tree: Path) -> None:
    """An import only for type checkers never runs, but a cycle through it is still a knot."""
    number = plant(
        tree,
        "gmd/fairness/ranking.py",
        "from typing import TYPE_CHECKING",
        "if TYPE_CHECKING:",
        "    from gmd.fairness import policy",
    )
    uses = [
        imp
        for imp in read_modules(tree)["gmd.fairness.policy"].imports
        if imp.target == "gmd.fairness.ranking"
    ]
    if not uses:
        plant(tree, "gmd/fairness/policy.py", "from gmd.fairness import ranking")
    one_problem(
        tree, "import cycle", f"gmd/fairness/ranking.py:{number + 2}: `from gmd.fairness import"
    )


def test_an_import_cycle_between_packages_fails(tree: Path) -> None:
    """gmd-admin runs the simulator; the simulator importing any of gmd-admin (here a module
    that imports nothing of the simulator) makes the two parts one knot."""
    assert any(
        within(imp.target, "gmd.sim")
        for name, module in read_modules(tree).items()
        if within(name, "gmd.admin")
        for imp in module.imports
    )
    number = plant(tree, "gmd/sim/workload.py", "from gmd.admin import output")
    problem = one_problem(
        tree,
        "import cycle between packages gmd.admin → gmd.sim → gmd.admin",
        f"gmd/sim/workload.py:{number}: `from gmd.admin import output`",
    )
    assert problem.startswith("gmd/admin/"), problem
