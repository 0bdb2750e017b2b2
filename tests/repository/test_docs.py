"""The README is a newcomer's first page and docs/ holds the reference: the links between them
must lead somewhere, and the README must open with what a newcomer needs.

Links are checked as GitHub renders them: a relative path from the file that holds the link,
and a ``#fragment`` that is one of the target's headings, lowercased, with punctuation
dropped and spaces as hyphens.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "systemd" / "README.md"]
FENCED = re.compile(r"^```.*?^```", re.S | re.M)


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a ``# comment`` there is no heading)."""
    return FENCED.sub("", path.read_text())


def headings(path: Path) -> list[str]:
    return re.findall(r"^#+ (.+?)\s*$", prose(path), re.M)


def anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_reaches_a_file_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif fragment and fragment not in {anchor(h) for h in headings(dest)}:
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_opens_with_trying_and_installing_gmd() -> None:
    """The demo and the installation come before any reference material."""
    sections = re.findall(r"^## (.+?)\s*$", prose(REPO / "README.md"), re.M)
    first = sections[:5]
    assert "Try it" in first and "What the demo shows" in first, sections
    assert "Installation" in first, sections
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme[: readme.index("## Installation")]


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    linked = {
        (REPO / target.partition("#")[0]).resolve()
        for target in re.findall(r"\]\((docs/[^)\s]+)\)", prose(REPO / "README.md"))
    }
    orphans = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not orphans, orphans


def test_the_compute_hosts_install_lines_have_what_builds_libvirt_python() -> None:
    """libvirt-python has no wheel: pip compiles its C extension, which needs the libvirt and
    Python headers, gcc and pkg-config. Every install line that builds it (the one that
    installs libvirt-dev) says all four, in the README, docs/ and the development bootstrap."""
    needed = {"libvirt-dev", "python3-dev", "pkg-config", "gcc"}
    lines = [
        (path.relative_to(REPO), line)
        for path in [*PAGES, REPO / "tests" / "scripts" / "bootstrap.sh"]
        for line in path.read_text().splitlines()
        if "libvirt-dev" in line and ("apt-get install" in line or "need_apt" in line)
    ]
    assert {str(p) for p, _ in lines} >= {
        "README.md",
        "docs/install.md",
        "tests/scripts/bootstrap.sh",
    }
    missing = [(str(p), sorted(needed - set(line.split()))) for p, line in lines]
    assert all(not m for _, m in missing), missing


def _section(path: Path, title: str) -> str:
    text = path.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_running_without_systemd_shows_commands_and_flags_that_exist() -> None:
    """Every gmd-daemon and gmd-agent command in docs/install.md's "Running without systemd"
    (the shell loop, runit's run script, Supervisor's command=) uses flags the program's
    ``--help`` lists, and the exit codes the section gives are the ones ``--help`` states."""
    import subprocess
    import sys

    section = _section(REPO / "docs" / "install.md", "Running without systemd")
    blocks = "\n".join(b.strip("`") for b in FENCED.findall(section))
    used: dict[str, set[str]] = {"gmd-daemon": set(), "gmd-agent": set()}
    for line in blocks.splitlines():
        for program, flags in used.items():
            if re.search(rf"(^|[\s/=]){program}\s", line):
                after = line.split(program, 1)[1]
                flags.update(re.findall(r"(?<!\S)(--[a-z][a-z-]*)", after))
    assert used["gmd-daemon"] >= {"--config"} and used["gmd-agent"] >= {"--config"}, used
    bin_dir = Path(sys.executable).parent
    for program, flags in used.items():
        out = subprocess.run(
            [str(bin_dir / program), "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"},
        )
        assert out.returncode == 0, out.stderr
        assert "2 bad configuration or option" in " ".join(out.stdout.split())
        missing = [f for f in sorted(flags) if f not in out.stdout]
        assert not missing, (program, missing)
    assert "2 bad configuration or option: do not restart" in " ".join(section.split())


def test_sighup_reloads_the_agent_as_running_without_systemd_says(tmp_path: Path) -> None:
    """ "SIGHUP reloads … gmd-agent reloads on SIGHUP too": the real gmd-agent, on libvirt's
    test driver, once it has started ticking, goes on after SIGHUP and says what it did."""
    import signal
    import subprocess
    import sys
    import time

    from tests.support.agent_fixtures import NODE, uri

    section = " ".join(_section(REPO / "docs" / "install.md", "Running without systemd").split())
    assert "SIGHUP reloads" in section and "gmd-agent reloads on SIGHUP too" in section
    toml = tmp_path / "gmd.toml"
    toml.write_text(
        f'[agent]\nlibvirt_uri = "{uri(NODE)}"\ncollector = "libvirt"\nmetrics_port = 0\n'
        f'daemon_url = "http://127.0.0.1:9"\nspool_path = "{tmp_path / "spool.db"}"\n'
        'enforce_backend = "none"\n'
    )
    log = tmp_path / "agent.log"
    with log.open("w") as err:
        agent = subprocess.Popen(
            [str(Path(sys.executable).with_name("gmd-agent")), "--config", str(toml)],
            stderr=err,
            # As a shell or systemd starts it, whatever this test runs under (nohup ignores
            # SIGHUP, and a child inherits that).
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
        )
        try:
            deadline = time.monotonic() + 60
            while "gmd-agent for host" not in log.read_text():
                assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            agent.send_signal(signal.SIGHUP)
            while "SIGHUP: reloaded" not in log.read_text():
                assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            assert agent.poll() is None
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()


def test_the_module_map_in_development_md_is_the_tree() -> None:
    """docs/development.md lists every module of gmd/ with its docstring's first sentence, as
    tests/support/module_map.py makes it from the tree (``make module-map`` writes it)."""
    from tests.support.module_map import PAGE, module_map, page_copy

    copy = page_copy(PAGE.read_text())
    assert copy is not None, f"{PAGE}: the module map's markers are missing"
    made = module_map()
    assert copy == made, "docs/development.md's module map differs from the tree: make module-map"
    modules = sorted(p for p in (REPO / "gmd").rglob("*.py") if "__pycache__" not in p.parts)
    assert made.count("\n| `") == len(modules) > 100
