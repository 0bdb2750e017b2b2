"""Which host is calling: per-host bearer tokens, kept only as SHA-256, compared in constant time.

The token is checked before the body is read, against every configured host (no early exit,
so the time taken does not reveal which host's hash came closest), and identifies the host;
the batch must then be about that host.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping


class AuthError(Exception):
    """Why a request is not allowed; ``status`` 401 (no or unknown token) or 403 (wrong host)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class TokenAuth:
    """``hashes`` maps host name → hex SHA-256 of its token; ``required`` False disables auth."""

    def __init__(self, hashes: Mapping[str, str], required: bool = True) -> None:
        self.required = required
        self._hashes = [(host, bytes.fromhex(h)) for host, h in sorted(hashes.items())]

    def host_of(self, authorization: str | None) -> str | None:
        """The host the ``Authorization`` header's token belongs to; None when auth is off."""
        if not self.required:
            return None
        if not authorization:
            raise AuthError(401, "missing Authorization: Bearer TOKEN header")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError(401, "the Authorization header must be 'Bearer TOKEN'")
        digest = hashlib.sha256(token.strip().encode()).digest()
        match = None
        for host, expected in self._hashes:
            if hmac.compare_digest(digest, expected):
                match = host
        if match is None:
            raise AuthError(401, "the token matches no host in the daemon's configuration")
        return match

    @staticmethod
    def check_host(caller: str | None, host: str) -> None:
        """Raise unless the authenticated ``caller`` (None: auth off) may speak for ``host``."""
        if caller is not None and caller != host:
            raise AuthError(403, f"this token belongs to host {caller!r}, not {host!r}")
