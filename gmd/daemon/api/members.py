"""What a project member sees of the read API's answers: its own fairness, not the hypervisor.

Nova keeps its hosts from a project's members: a server's ``OS-EXT-SRV-ATTR:host``,
``hypervisor_hostname`` and ``instance_name`` (the libvirt domain) are the admin's by default,
and a member sees only ``hostId``, ``sha224(project_id + host)``: the same for two of its own
servers on one host, different for another project's, and saying nothing of the host's name.
gmd's answers are written for operators (``gmd-admin … --format json`` prints the same
documents) and name hosts, their owners and what their agents reported, libvirt's and the
kernel's words included. :func:`for_member` is the one place an operator's document becomes a
member's; every read route and the web page pass a member's answers through it, whatever the
document (standings, explanation, report, enforcement log), so a field added to a report later
is covered too:

- **a host's name**, wherever it is (a ``host`` field, the summary's "on cmp-7", a log reason),
  becomes the host's ``hostId`` for the project: exactly what Nova shows the member for a
  server on that host (:func:`host_id`), so the member can tell which of its servers a
  sentence is about (``openstack server show SERVER -c hostId``), and nothing more. Every host
  the ledger knows is looked for, not only those of the document's own fields. (Like Nova's,
  the hash is not keyed: someone who guesses a host's name can check the guess, as Nova's
  hostId already allows. It is Nova's own where the agent's ``host`` is Nova's name for the
  host.)
- **a host's owner** (``organization``: it may be another customer) is left out.
- **what a host said**: an enforcement log row a host reported (``host_apply``,
  ``host_restore``) gets its reason in gmd's words, from the row's kind, status and dry-run
  flag ("the host could not apply the plan's limits to this VM (plan of …)"): a host's error
  text names the libvirt domain, cgroup paths and libvirt's or the kernel's message, which
  are the operator's to read. Each knob the host could not set is named, with its outcome in
  words ("its disk weight: this host cannot set it"). A cap a host cannot set is said without
  its agent's reason ("this host cannot set the cap (its agent says so)"). Any other host text
  (an ``error`` or ``detail`` field, a knob's detail) is said in words from the outcome beside
  it, or left empty. An explanation is made a member's before its summary is written, so that
  the summary's sentences are built from what a member may read.
- **a path** (``/sys/fs/cgroup/…``) left anywhere in a text becomes "a path on the host".

An operator's answers are not changed. docs/api.md says what each reader sees.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select

from gmd.ledger_schema.kinds import ActionKind, ActionStatus
from gmd.ledger_schema.tables import hosts as _hosts
from gmd.wire import KnobOutcome, knob_words

if TYPE_CHECKING:
    from gmd.daemon.reports.explain import Explanation

HIDDEN_KEYS = frozenset({"organization"})
"""Fields a member never gets: a host's owner may be another customer."""
HOST_TEXT_KEYS = frozenset({"error", "detail"})
"""Fields that hold what a host said (libvirt's, the kernel's, the agent's words)."""
HOST_REPORTS = frozenset({ActionKind.host_apply.value, ActionKind.host_restore.value})
"""The enforcement log's rows whose reason is a host's report."""
PATH_WORDS = "a path on the host"
OUTCOME_WORDS = {
    KnobOutcome.failed.value: "the host could not set it",
    KnobOutcome.unsupported.value: "this host cannot set it",
}
"""A knob's outcome, for what the host said of it"""

# A token that may be a host's name: anything between white space, punctuation that never ends
# a name in gmd's texts, and quotes.
_TOKEN = re.compile(r"[^\s,;()\[\]{}<>'\"]+")
_NAME_CHARS = re.compile(r"^[^\s,;()\[\]{}<>'\"]+$")
# An absolute path of at least two parts, not inside a word, a URL or a ratio ("MB/s").
_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/'\"()\[\],;]+/)+[^\s'\"()\[\],;]*")
# Which plan a host's report was about, as audit.py appends it to the host's text ("(plan of
# 2026-…, reported by host cmp-1)") and as a member's words keep it ("(plan of 2026-…)").
_SOURCE = re.compile(r"\((plan of [^,()]*|gmd-agent --restore-all)[,)]")


def host_id(project: str, host: str) -> str:
    """A host as a member of ``project`` may know it: Nova's ``hostId`` for the project's
    servers on it (``nova.utils.generate_hostid``: the hex SHA-224 of project id + host)."""
    return hashlib.sha224((project + host).encode()).hexdigest()


def for_member(conn: Connection, project: str, answer: Any) -> Any:
    """An operator's answer (any read route's document, or an explanation, whose summary
    is written from what it holds) as a member of ``project`` may read it (see the module
    docstring); the hosts looked for are the ledger's."""
    names = conn.execute(select(_hosts.c.name)).scalars()
    return MemberView(project, names).answer(answer)


class MemberView:
    """The rules of the module docstring for one member's project and a set of host names."""

    def __init__(self, project: str, hosts: Iterable[str]) -> None:
        self.project = project
        names = set(hosts)
        self._hosts = {n for n in names if _NAME_CHARS.match(n)}
        # A name with a space or a comma is not one token: looked for as a substring, longest
        # first (rare: hosts are DNS names).
        self._odd = sorted(names - self._hosts, key=len, reverse=True)

    def label(self, host: str) -> str:
        return host_id(self.project, host)

    def answer(self, answer: Any) -> Any:
        """A document, or an explanation (made a member's before it is written: its
        summary's sentences are built from its hosts, caps and actions), as a member's."""
        from gmd.daemon.reports.explain import Explanation

        if isinstance(answer, Explanation):
            answer = self.explanation(answer).document()
        return self.document(answer)

    def explanation(self, e: Explanation) -> Explanation:
        """``e`` with the host's words out of what its summary is written from: its hosts
        and caps under their labels, a cap a host cannot set said without the agent's reason
        ("this host cannot set the cap (its agent says so)"), its actions as
        :meth:`document` gives them."""
        from gmd.daemon.reports.enforcement import caps_words

        effect = e.policy.effect(e.level)
        caps = []
        for c in e.caps:
            decisions = {r: replace(d, detail="") for r, d in c.decisions.items()}
            words = caps_words(effect, decisions)
            caps.append(replace(c, host=self.label(c.host), decisions=decisions, words=words))
        hosts = [replace(h, name=self.label(h.name), organization="") for h in e.hosts]
        return replace(e, hosts=hosts, caps=caps, actions=self.document(e.actions))

    def document(self, value: Any) -> Any:
        """``value`` with every rule applied, all the way down; a new object."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple):
            return [self.document(v) for v in value]
        if not isinstance(value, dict):
            return value
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if key in HIDDEN_KEYS:
                continue
            if key in HOST_TEXT_KEYS and isinstance(item, str):
                out[key] = outcome_words(value)  # the key stays: readers expect it
                continue
            if key == "knobs" and isinstance(item, dict):
                # knob → [outcome, the host's detail] (the log's column), or → {outcome, detail}
                out[key] = {k: self._knob(v) for k, v in item.items()}
                continue
            out[self.text(key) if isinstance(key, str) else key] = self.document(item)
        if value.get("kind") in HOST_REPORTS and "reason" in value:
            out["reason"] = report_words(value)
        return out

    def _knob(self, value: Any) -> Any:
        """A knob's ``[outcome, detail]`` with the detail in words; any other form as
        :meth:`document` gives it."""
        if isinstance(value, list) and value:
            return [value[0], OUTCOME_WORDS.get(str(value[0]), "")]
        return self.document(value)

    def text(self, text: str) -> str:
        """Host names → their labels; paths → :data:`PATH_WORDS`."""
        text = _TOKEN.sub(self._token, text)
        for name in self._odd:
            text = text.replace(name, self.label(name))
        return _PATH.sub(PATH_WORDS, text)

    def _token(self, match: re.Match[str]) -> str:
        token = match.group(0)
        if token in self._hosts:
            return self.label(token)
        bare = token.rstrip(".:!?")
        if bare != token and bare in self._hosts:
            return self.label(bare) + token[len(bare) :]
        return token


def report_words(row: dict[str, Any]) -> str:
    """A host's report on one VM (an enforcement log row), in gmd's words: what became of
    the plan, and which plan (or ``gmd-agent --restore-all``), never what the host said."""
    apply = row.get("kind") == ActionKind.host_apply.value
    ok = row.get("status") == ActionStatus.ok.value
    after = row.get("after")
    # A failed apply that changed some settings still throttles (reports.enforced reads it so).
    partly = apply and not ok and isinstance(after, dict) and len(after) > 1
    outcome = "ok" if ok else "partly" if partly else "failed"
    words = _REPORT_WORDS[apply, outcome, bool(row.get("dry_run"))]
    for knob, said in knob_outcomes(row.get("knobs")):
        if said in OUTCOME_WORDS:
            words += f"; its {knob_words(knob)}: {OUTCOME_WORDS[said]}"
    found = _SOURCE.search(str(row.get("reason") or ""))
    return words + (f" ({found.group(1)})" if found else "")


def knob_outcomes(knobs: Any) -> list[tuple[str, str]]:
    """(knob, outcome) of a report's knobs, as the log's column keeps them (``{"cpu_cap":
    ["applied", ""]}``), as reports show them (``{"cpu_cap": {"outcome": …, "detail": …}}``)
    or as the wire sends them (``[{"knob": …, "outcome": …}]``)."""
    if isinstance(knobs, dict):
        return [
            (str(k), str(v[0] if isinstance(v, list) else v.get("outcome")))
            for k, v in knobs.items()
            if (isinstance(v, list) and v) or isinstance(v, dict)
        ]
    if isinstance(knobs, list):
        return [
            (str(k.get("knob")), str(k.get("outcome")))
            for k in knobs
            if isinstance(k, dict) and "knob" in k
        ]
    return []


_LIMITS = "the plan's limits to this VM"
_BACK = "this VM's own settings back"
_REPORT_WORDS = {
    (True, "ok", False): f"the host applied {_LIMITS}",
    (True, "partly", False): f"the host applied part of {_LIMITS} and could not apply the rest",
    (True, "failed", False): f"the host could not apply {_LIMITS}",
    (True, "ok", True): f"dry-run: the host would have applied {_LIMITS}",
    (True, "partly", True): f"dry-run: the host would have applied part of {_LIMITS}, not all",
    (True, "failed", True): f"dry-run: the host found it could not apply {_LIMITS}",
    (False, "ok", False): f"the host put {_BACK}",
    (False, "failed", False): f"the host could not put {_BACK}",
    (False, "ok", True): f"dry-run: the host would have put {_BACK}",
    (False, "failed", True): f"dry-run: the host found it could not put {_BACK}",
}


def outcome_words(item: dict[str, Any]) -> str:
    """What a host's ``error`` or ``detail`` beside an outcome says, in plain words: that it
    failed, or that the host cannot set it; nothing when the outcome says it already."""
    outcome = str(item.get("outcome"))
    if outcome in OUTCOME_WORDS:
        return OUTCOME_WORDS[outcome]
    if item.get("ok") is False:
        return "the host could not apply it"
    return ""
