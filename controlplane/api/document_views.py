"""Protobuf views of what every versioned document's API shares (`document.proto`): its
changes, its activations, and the release options of a publish or activate request; and
`DocumentCalls`, the request-to-view half of every versioned document's servicer (tenants,
accounts, routing policies), so that a servicer method is only its own messages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from google.protobuf import timestamp_pb2

from controlplane.api.auth import require_caller
from controlplane.domain.document_diff import Change
from controlplane.persistence.documents import ActivationRow, DocumentRow
from controlplane.service.access import Caller
from controlplane.service.versioned import DocumentService, Publication, Release
from vidroute.scheduler.v1 import document_pb2

ACTIONS = {
    "PUBLISHED": document_pb2.DOCUMENT_ACTION_PUBLISHED,
    "ROLLED_BACK": document_pb2.DOCUMENT_ACTION_ROLLED_BACK,
    "SCHEDULED": document_pb2.DOCUMENT_ACTION_SCHEDULED,
    "ACTIVATED": document_pb2.DOCUMENT_ACTION_ACTIVATED,
}


def ts(at: datetime | None) -> timestamp_pb2.Timestamp | None:
    if at is None:
        return None
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(at.astimezone(UTC))
    return out


def changes_view(changes: Iterable[Change]) -> list[document_pb2.DocumentChange]:
    return [
        document_pb2.DocumentChange(path=c.path, before=c.before, after=c.after) for c in changes
    ]


def activation_fields(row: ActivationRow) -> dict[str, Any]:
    """The fields every kind's activation message has, by name (the action excepted)."""
    return {
        "version": row.version,
        "previous_version": row.previous_version or "",
        "actor": row.actor,
        "at": ts(row.at),
        "requested_at": ts(row.requested_at or row.at),
        "reason": row.reason,
        "pending": row.pending,
    }


def activation_view(row: ActivationRow) -> document_pb2.DocumentActivation:
    return document_pb2.DocumentActivation(
        action=ACTIONS.get(row.action, document_pb2.DOCUMENT_ACTION_UNSPECIFIED),
        **activation_fields(row),
    )


def publication_fields(out: Publication) -> dict[str, Any]:
    """A publish response's ``changes`` and ``activate_at``, by name (the version message's
    name differs by kind)."""
    return {"changes": changes_view(out.changes), "activate_at": ts(out.activate_at)}


def release_of(request: Any) -> Release:
    """`Release` from a publish request's ``activate_at`` / ``staged`` / ``reason`` (an activate
    request has no ``staged``)."""
    at = request.activate_at.ToDatetime(UTC) if request.HasField("activate_at") else None
    staged = bool(getattr(request, "staged", False))
    return Release(activate_at=at, staged=staged, reason=request.reason)


V = TypeVar("V")  # a kind's version message (AccountConfigVersion, RoutingPolicyVersion)
A = TypeVar("A")  # a kind's activation message (AccountConfigActivation)


def version_view(message: Callable[..., V], builtin_version: str) -> Callable[[DocumentRow], V]:
    """The view of a stored version as `message`; the built-in version, never published, has
    no ``published_at``."""

    def view(row: DocumentRow) -> V:
        builtin = row.version == builtin_version
        return message(
            version=row.version,
            document=row.document,
            active=row.active,
            published_at=None if builtin else ts(row.published_at),
            source=row.source,
            activated_at=ts(row.activated_at),
        )

    return view


def kind_activation_view(
    message: Callable[..., A], actions: Mapping[str, int], unspecified: int
) -> Callable[[ActivationRow], A]:
    """The view of an activation as a kind's own `message`, its action from `actions`."""

    def view(row: ActivationRow) -> A:
        return message(action=actions.get(row.action, unspecified), **activation_fields(row))

    return view


class DocumentCalls(Generic[V]):
    """Publish, roll back, activate and list one kind of document for its servicer: the
    request decoded, the caller found (`controlplane.api.auth`), the service called, the
    result as the kind's `view`. Domain errors pass through to the status interceptor."""

    def __init__(
        self,
        service: DocumentService,
        view: Callable[[DocumentRow], V],
        *,
        field: str,
        default_caller: Caller | None = None,
    ) -> None:
        self._service, self.view = service, view
        self._field = field  # the version's field in a publish response: "config", "policy"
        self._default_caller = default_caller  # only for a servicer driven without the server

    def caller(self) -> Caller:
        return require_caller(self._default_caller)

    async def publish(self, request: Any) -> dict[str, Any]:
        """A publish response's fields, by name."""
        out = await self._service.release(
            request.document,
            request.source,
            request.dry_run,
            self.caller(),
            release=release_of(request),
        )
        return {self._field: self.view(out.row), **publication_fields(out)}

    async def rollback(self, request: Any) -> V:
        row = await self._service.rollback(request.version, self.caller(), reason=request.reason)
        return self.view(row)

    async def activate(self, request: Any) -> V:
        row = await self._service.activate(
            request.version, self.caller(), release=release_of(request)
        )
        return self.view(row)

    async def history(self, activation: Callable[[ActivationRow], A]) -> dict[str, Any]:
        """A history response's ``versions`` and ``activations`` (as `activation`), by name."""
        history = await self._service.history(self.caller())
        return {
            "versions": [self.view(r) for r in history.versions],
            "activations": [activation(a) for a in history.activations],
        }
