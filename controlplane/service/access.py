"""Who is calling, and what they may see: the tenant scoping rules of the public API.

A `Caller` is an authenticated identity (the API edge, `controlplane.api.auth`, produces it from
a bearer token) with a role. The rules, applied by the services rather than the transport, so
every entry point that reaches a service obeys the same ones:

- a tenant caller creates tasks only in its own tenant (else `PermissionDenied`); an admin in any;
- a tenant caller sees only its own tenant's tasks; another tenant's task is `NotFound`, exactly as
  an id that does not exist, so neither existence nor the id sequence leaks;
- admin operations (provider administration, breakers) need the admin role.

`SYSTEM` is the caller of in-process code (engines, tests): unscoped, like an admin.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vidroute_core.exceptions import NotFound, PermissionDenied


class Role(enum.Enum):
    TENANT = "tenant"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated principal. `tenant_id` is None only for admins."""

    role: Role
    tenant_id: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.role is Role.TENANT and not self.tenant_id:
            raise ValueError("a tenant caller needs a tenant id")

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @classmethod
    def tenant(cls, tenant_id: str, name: str = "") -> Caller:
        return cls(Role.TENANT, tenant_id, name or f"tenant:{tenant_id}")

    @classmethod
    def admin(cls, name: str = "admin") -> Caller:
        return cls(Role.ADMIN, None, name)


SYSTEM = Caller.admin("system")


def ensure_admin(caller: Caller, operation: str) -> None:
    if not caller.is_admin:
        raise PermissionDenied(f"{operation} needs the admin role", operation=operation)


def ensure_own_tenant(caller: Caller, tenant_id: str) -> None:
    """A request naming a tenant must name the caller's own (admins may name any)."""
    if not caller.is_admin and tenant_id != caller.tenant_id:
        raise PermissionDenied(
            f"caller {caller.name} may not act for tenant {tenant_id!r}", operation="tenant"
        )


def ensure_visible(caller: Caller, tenant_id: str, resource: str, resource_id: str) -> None:
    """Another tenant's resource is NotFound, indistinguishable from a missing one."""
    if not caller.is_admin and tenant_id != caller.tenant_id:
        raise NotFound(resource, resource_id)


def list_scope(caller: Caller, requested_tenant: str | None) -> str | None:
    """The tenant a list is filtered by: the caller's own unless an admin asks otherwise."""
    if caller.is_admin:
        return requested_tenant or None
    if requested_tenant:
        ensure_own_tenant(caller, requested_tenant)
    return caller.tenant_id
