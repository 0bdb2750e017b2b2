"""A thin client of gmd's read API over a keystoneauth session (docs/api.md)."""

from __future__ import annotations

from typing import Any

from gmd import GmdError

SERVICE_TYPE = "fairness"
"""gmd's service type in the Keystone catalog"""


class FairnessError(GmdError):
    """The read API refused (its Problem's detail), or the catalog has no fairness endpoint."""


class FairnessClient:
    def __init__(self, session: Any, endpoint: str | None) -> None:
        self.session, self.endpoint = session, endpoint

    def get(self, path: str, **params: Any) -> Any:
        """The JSON document at ``path`` (``/v1/…``); :class:`FairnessError` saying why not."""
        if not self.endpoint:
            raise FairnessError(
                f"the catalog has no {SERVICE_TYPE!r} endpoint for this region and interface"
                " (openstack endpoint create … fairness …, see gmd's docs/api.md)"
            )
        query = {k: v for k, v in params.items() if v is not None}
        response = self.session.get(self.endpoint.rstrip("/") + path, params=query, raise_exc=False)
        if response.status_code != 200:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = None
            raise FairnessError(f"{response.status_code}: {detail or response.text[:200]}")
        return response.json()
