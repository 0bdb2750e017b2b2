"""The OpenStack client's retries, timeouts and errors (gmd.openstack.client), met through its
first user, the Nova quota adapter.

The real openstacksdk, configured by a ``clouds.yaml`` as in production, meets
``tests/support/fake_openstack.py`` for what a real service cannot be made to do on demand: 5xx,
slowness, a refused connection, a 401 on a valid token, and an SDK that breaks. What the real
services answer (400/401/403/406, unified limits) is in tests/cloud/test_openstack_quotas.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gmd.daemon.enforce.nova_quotas import NovaQuotas
from gmd.daemon.enforce.quotas import QuotaSet
from gmd.openstack.client import OpenStackError
from tests.support.fake_openstack import FakeOpenStack, write_clouds_yaml

# openstacksdk warns about its own internals (deprecated in SDK 5/6), not about our calls.
pytestmark = pytest.mark.filterwarnings("ignore::openstack.warnings._RemovedInSDKWarning")

CLOUD = "fake"
PID = "7f3c9a1e2b4d4c6e8f0a1b2c3d4e5f60"
DEFAULTS = QuotaSet(cores=20, ram_mb=51200, instances=10)
QUOTA_PATH = f"/os-quota-sets/{PID}"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenStack]:
    """A normal fake cloud, named ``fake`` in the clouds.yaml that OS_CLIENT_CONFIG_FILE names."""
    with FakeOpenStack() as cloud:
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(write_clouds_yaml(tmp_path, cloud)))
        yield cloud


def use_cloud(cloud: FakeOpenStack, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(write_clouds_yaml(directory, cloud)))


class Sleeps(list[float]):
    """Records the backoff delays instead of sleeping them."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def adapter(sleeps: Sleeps | None = None, **kw: Any) -> NovaQuotas:
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("retries", 2)
    kw.setdefault("backoff_s", 0.1)
    return NovaQuotas(CLOUD, sleep=sleeps if sleeps is not None else Sleeps(), **kw)


def puts(fake: FakeOpenStack) -> list[Any]:
    return [r.body for r in fake.requests if r.method == "PUT"]


def test_401_from_nova_is_not_retried_by_us(fake: FakeOpenStack) -> None:
    fake.fail(401, None)
    sleeps = Sleeps()
    with pytest.raises(OpenStackError) as caught:
        adapter(sleeps).get(PID)
    assert (caught.value.kind, caught.value.status) == ("unauthorized", 401)
    assert sleeps == []
    # keystoneauth itself fetches a new token once on a 401 and repeats the request; that is
    # all: two GETs and two tokens, not the 3 attempts our retries would make.
    assert fake.count("GET", QUOTA_PATH) == 2
    assert fake.count("POST", "/v3/auth/tokens") == 2


def test_503_twice_then_ok_is_retried_with_exponential_backoff(fake: FakeOpenStack) -> None:
    fake.fail(503, 2, method="PUT")
    sleeps = Sleeps()
    write = adapter(sleeps, retries=2, backoff_s=0.1).apply(PID, QuotaSet(10, 25600, 5))
    assert write.ok and write.after == QuotaSet(10, 25600, 5)
    assert sleeps == [0.1, 0.2]
    assert [r.status for r in fake.requests if r.method == "PUT"] == [503, 503, 200]


def test_503_forever_is_unavailable_after_the_configured_retries(fake: FakeOpenStack) -> None:
    fake.fail(503, None)
    sleeps = Sleeps()
    with pytest.raises(OpenStackError) as caught:
        adapter(sleeps, retries=3, backoff_s=0.5, backoff_max_s=1.5).get(PID)
    assert (caught.value.kind, caught.value.status) == ("unavailable", 503)
    assert caught.value.retryable
    assert fake.count("GET", QUOTA_PATH) == 4
    assert sleeps == [0.5, 1.0, 1.5]  # exponential, capped at backoff_max_s


def test_retries_in_clouds_yaml_do_not_multiply_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator's clouds.yaml may ask openstacksdk to retry by itself; the adapter turns
    # that off so that its retries are the only ones (and the time bound holds).
    with FakeOpenStack() as fake:
        settings = {"status_code_retries": 5, "compute_status_code_retries": 5}
        path = write_clouds_yaml(tmp_path, fake, connect_retries=5, **settings)
        monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(path))
        fake.fail(503, None)
        with pytest.raises(OpenStackError) as caught:
            adapter(retries=1).get(PID)
    assert caught.value.kind == "unavailable"
    assert fake.count("GET", QUOTA_PATH) == 2


def test_real_backoff_sleeps_are_taken(fake: FakeOpenStack) -> None:
    fake.fail(503, 2)
    started = time.monotonic()
    nova = NovaQuotas(CLOUD, timeout_s=2.0, retries=2, backoff_s=0.1)
    assert nova.get(PID) == DEFAULTS
    assert 0.3 <= time.monotonic() - started < 2.0


def test_slow_server_times_out_within_bounded_time(fake: FakeOpenStack) -> None:
    fake.slow(10.0)
    sleeps = Sleeps()
    started = time.monotonic()
    with pytest.raises(OpenStackError) as caught:
        adapter(sleeps, timeout_s=0.3, retries=1).get(PID)
    elapsed = time.monotonic() - started
    assert caught.value.kind == "timeout"
    assert "no answer within the timeout" in str(caught.value)
    assert 0.6 <= elapsed < 2.5
    assert fake.count("GET", QUOTA_PATH) == 2
    assert sleeps == [0.1]


def test_connection_refused_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenStack() as gone:
        use_cloud(gone, tmp_path, monkeypatch)
    # The server is closed now; its port refuses connections.
    sleeps = Sleeps()
    with pytest.raises(OpenStackError) as caught:
        adapter(sleeps, retries=1).restore(PID, DEFAULTS)
    assert caught.value.kind == "unavailable"
    assert caught.value.operation == "restore (read before)"
    assert sleeps == [0.1]


def test_unknown_cloud_is_a_config_error(fake: FakeOpenStack) -> None:
    sleeps = Sleeps()
    nova = NovaQuotas("no-such-cloud", retries=3, sleep=sleeps)
    with pytest.raises(OpenStackError) as caught:
        nova.get(PID)
    assert caught.value.kind == "config"
    assert "'no-such-cloud'" in str(caught.value) and "clouds.yaml" in str(caught.value)
    assert sleeps == []
    assert fake.requests == []


def test_anything_the_sdk_raises_becomes_an_openstack_error(fake: FakeOpenStack) -> None:
    class Broken:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("the SDK broke in a new way")

    made: list[dict[str, Any]] = []

    def factory(**kw: Any) -> Any:
        made.append(kw)
        conn = Broken()
        return type("Conn", (), {"compute": conn, "close": lambda self: None})()

    sleeps = Sleeps()
    with pytest.raises(OpenStackError) as caught:
        adapter(sleeps, connection_factory=factory, timeout_s=3.5).get(PID)
    assert caught.value.kind == "error"
    assert "RuntimeError: the SDK broke in a new way" in str(caught.value)
    assert sleeps == []
    # The factory is called like openstack.connect, with our timeout and no SDK retries.
    assert made == [
        {
            "cloud": CLOUD,
            "api_timeout": 3.5,
            "connect_retries": 0,
            "status_code_retries": 0,
            "compute_connect_retries": 0,
            "compute_status_code_retries": 0,
            "identity_connect_retries": 0,
            "identity_status_code_retries": 0,
            "placement_connect_retries": 0,
            "placement_status_code_retries": 0,
        }
    ]
