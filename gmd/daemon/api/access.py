"""Who may read what through the read API: an operator every customer, a project member only
its own project.

With ``[read_api] auth = "keystone"`` the caller's ``X-Auth-Token`` is validated by
keystonemiddleware's ``auth_token`` — the same code, options, caching and revocation checks
as every OpenStack service's — and what it may read is decided by oslo.policy's rules below,
which an operator can override in a policy file as for any OpenStack service. ``auth_token``
is WSGI middleware: here it wraps a WSGI application that does nothing, and each request's
token is put through it (on a worker thread: it may ask Keystone) to learn who is calling.

With ``auth = "local"`` (a daemon bound to loopback) every request is the operator's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from gmd import GmdError
from gmd.daemon.config import ReadApiConfig

READ_EVERYONE = "fairness:read_everyone"
READ_PROJECT = "fairness:read_project"


@dataclass(frozen=True)
class ReadCaller:
    """The caller of a read route: ``everyone`` (an operator), or a member of ``project_id``."""

    name: str
    everyone: bool
    project_id: str | None = None
    policy: Any = None
    """the caller's policy credentials (Keystone), for :meth:`may_read`"""
    rules: Any = None

    def may_read(self, customer: str) -> bool:
        """Whether the caller may see the customer (a project uuid) and its VMs."""
        if self.everyone:
            return True
        if self.rules is None:
            return False
        return bool(self.rules.enforce(READ_PROJECT, {"project_id": customer}, self.policy))


class Unauthenticated(GmdError):
    """No token, or one Keystone does not vouch for (expired, revoked, made up);
    ``challenge`` tells the client where to get one (``WWW-Authenticate``)."""

    def __init__(self, message: str, challenge: str) -> None:
        super().__init__(message)
        self.challenge = challenge


class ReadAccess(Protocol):
    def reader(self, token: str | None) -> ReadCaller: ...


class LocalAccess:
    """The operator's local admin mode: every caller reads everything."""

    def reader(self, token: str | None) -> ReadCaller:
        return ReadCaller("the operator (local)", everyone=True)


def policy_defaults() -> list[Any]:
    """The rules and their documented defaults (``oslopolicy-sample-generator`` style)."""
    from oslo_policy import policy

    return [
        policy.RuleDefault(
            READ_EVERYONE,
            "(role:admin or role:reader) and (system_scope:all or project_id:%(admin_project_id)s)",
            description="Read every customer's standing, reports, explanations and plots:"
            " admins and readers with a system-scoped token or one of the admin project"
            " ([read_api] admin_project_id).",
        ),
        policy.RuleDefault(
            READ_PROJECT,
            f"rule:{READ_EVERYONE} or (project_id:%(project_id)s and (role:member or role:reader))",
            description="Read one project's standing, report, explanation and plot: the"
            " operators above, and the project's own members and readers.",
        ),
    ]


_NOT_KNOWN = 'The option "%s" is not known to keystonemiddleware'


@contextmanager
def _plugin_options_known(auth_type: str | None) -> Iterator[None]:
    """auth_token warns, at every start, of each option of its auth plugin (``username``,
    ``password``, ``project_name``…) as "not known to keystonemiddleware", then hands them to
    the plugin, which uses them. Those warnings are left out; one for any other key (a typo)
    stays."""
    from keystoneauth1 import loading

    try:
        plugin = {o.dest for o in loading.get_plugin_loader(auth_type or "password").get_options()}
    except Exception:  # an unknown auth_type: auth_token says so itself
        plugin = set()

    def wanted(record: logging.LogRecord) -> bool:
        return not (
            record.msg == _NOT_KNOWN
            and isinstance(record.args, tuple)
            and record.args
            and record.args[0] in plugin
        )

    logger = logging.getLogger("keystonemiddleware._common.config")
    logger.addFilter(wanted)
    try:
        yield
    finally:
        logger.removeFilter(wanted)


class KeystoneAccess:
    """Keystone tokens (keystonemiddleware) and oslo.policy rules (see the module docstring)."""

    def __init__(self, config: ReadApiConfig) -> None:
        from keystonemiddleware import auth_token
        from oslo_config import cfg
        from oslo_policy import policy

        options = {**config.keystone, "delay_auth_decision": "false"}
        with _plugin_options_known(options.get("auth_type")):
            self._protocol = auth_token.AuthProtocol(_identity_only, options)
        conf = cfg.ConfigOpts()
        conf([], project="gmd", default_config_files=[])
        # Rules from the policy file (when given) over the defaults registered below.
        self._enforcer = policy.Enforcer(
            conf, policy_file=None if config.policy_file is None else str(config.policy_file)
        )
        self._enforcer.register_defaults(policy_defaults())
        self._admin_project_id = config.admin_project_id
        # As every OpenStack service answers a 401: where to get a token.
        self._challenge = f'Keystone uri="{config.keystone["www_authenticate_uri"]}"'

    def reader(self, token: str | None) -> ReadCaller:
        """Who ``token`` belongs to; :class:`Unauthenticated` when Keystone does not say."""
        import webob
        from oslo_context import context

        if not token:
            raise Unauthenticated("no X-Auth-Token: a Keystone token is required", self._challenge)
        request = webob.Request.blank("/")
        request.headers["X-Auth-Token"] = token
        response = request.get_response(self._protocol)
        if response.status_int != 200 or request.environ.get("HTTP_X_IDENTITY_STATUS") != (
            "Confirmed"
        ):
            raise Unauthenticated(
                "the X-Auth-Token is not valid (expired, revoked or unknown)", self._challenge
            )
        creds = context.RequestContext.from_environ(request.environ).to_policy_values()
        rules = _Rules(self._enforcer, self._admin_project_id)
        everyone = rules.enforce(READ_EVERYONE, {}, creds)
        name = request.environ.get("HTTP_X_USER_NAME") or "a Keystone user"
        project = request.environ.get("HTTP_X_PROJECT_ID")
        return ReadCaller(str(name), bool(everyone), project, creds, rules)


@dataclass(frozen=True)
class _Rules:
    enforcer: Any
    admin_project_id: str

    def enforce(self, rule: str, target: dict[str, Any], creds: Any) -> bool:
        # An unset admin project matches no token: "" is no project's id.
        full = {"admin_project_id": self.admin_project_id or "", **target}
        return bool(self.enforcer.enforce(rule, full, creds))


def _identity_only(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """What auth_token hands a valid request to: the caller is in ``environ`` already."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b""]


def read_access(config: ReadApiConfig) -> ReadAccess | None:
    """The configured access, or ``None`` when the read API is off."""
    if config.auth == "local":
        return LocalAccess()
    if config.auth == "keystone":
        return KeystoneAccess(config)
    return None
