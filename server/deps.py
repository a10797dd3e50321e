"""The FastAPI dependencies routes take: the service's parts, and the tenant a request comes from."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from gatehead.server.services import Services


def services(request: Request) -> Services:
    return request.app.state.services


@dataclass(frozen=True)
class Tenant:
    """Who a request comes from: its API key (hashed), or the one tenant of an open server.

    Threads and prefix-cache blocks are keyed by the tenant, never by client-supplied ids.
    """

    id: str
    cache_salt: str | None  # one salt per key; none on an open server (one tenant, one cache)

    def thread(self, thread_id: str | None) -> tuple[str, str]:
        """(the client's thread id, a new one if none; the internal key, which is per tenant)."""
        public = thread_id or uuid.uuid4().hex
        return public, f"{self.id}:{public}"


def tenant(request: Request, parts: Annotated[Services, Depends(services)]) -> Tenant:
    key = request.state.tenant  # set by the admission middleware
    return Tenant(key, key if parts.config.api_keys else None)


ServicesDep = Annotated[Services, Depends(services)]
TenantDep = Annotated[Tenant, Depends(tenant)]

