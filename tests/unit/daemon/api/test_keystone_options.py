"""keystonemiddleware's start says nothing of the auth plugin's own options (five warnings at
every start, "The option "username" is not known to keystonemiddleware"), and still names a key
that is nobody's (a typo)."""

from __future__ import annotations

import pytest

from gmd.daemon.api.access import KeystoneAccess
from gmd.daemon.config import ReadApiConfig


def test_only_keys_no_one_knows_are_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    options = {
        "www_authenticate_uri": "http://127.0.0.1:9/v3",
        "auth_url": "http://127.0.0.1:9/v3",
        "auth_type": "password",
        "username": "gmd",
        "password": "secret",
        "user_domain_name": "Default",
        "project_name": "service",
        "project_domain_name": "Default",
        "memcached_servers": "127.0.0.1:11211",
        "usrname": "typo",
    }
    with caplog.at_level("WARNING"):
        KeystoneAccess(ReadApiConfig(auth="keystone", keystone=options))
    unknown = [r.getMessage() for r in caplog.records if "is not known" in r.getMessage()]
    assert unknown == ['The option "usrname" is not known to keystonemiddleware']
