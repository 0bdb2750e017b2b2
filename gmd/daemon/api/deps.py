"""The daemon's parts and the calling host, handed to routes as FastAPI dependencies.

Routes get :class:`~.services.Services` from the app rather than from a closure, so each
router module stands alone. The caller is a dependency, not a body check, so a request with a
bad token is refused before its body is validated or parsed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from gmd.daemon.api.services import Services


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def caller(
    services: ServicesDep, authorization: Annotated[str | None, Header()] = None
) -> str | None:
    """The host the bearer token belongs to, checked before the body is validated. Async:
    a hash and a dict lookup need no thread, and FastAPI sends a plain function to its thread
    pool, one more hand-off per request when every host posts at once."""
    return services.auth.host_of(authorization)


Caller = Annotated[str | None, Depends(caller)]
