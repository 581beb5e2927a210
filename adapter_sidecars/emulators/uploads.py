"""Runway's ephemeral uploads (provider-apis.md §1.10, §5), storage side included.

``POST /v1/uploads {"filename", "type": "ephemeral"}`` answers ``{"uploadUrl", "fields",
"runwayUri"}``; the client then POSTs ``multipart/form-data`` with every field plus ``file`` to
``uploadUrl``, the way ``runwayml``'s ``client.uploads.create_ephemeral`` does (a plain httpx
client, no Runway auth: the fields are the credential, like an S3 presigned POST). The storage
side lives on the emulator under `UPLOAD_PREFIX`, answers 204 like S3 and refuses wrong fields
with S3's XML errors (a file over the size cap or not an image or video is refused). A
``runway://`` URI is usable once its file arrived, until the slot's lifetime ends.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from adapter_sidecars.emulators.http import Request, Response

UPLOAD_PREFIX = "/upload-bucket/"
#: How long a slot accepts its file, and how long an uploaded file stays usable.
SLOT_TTL_S = 3600.0
#: What an ephemeral upload may hold: the images and videos a task takes as input.
UPLOAD_TYPES = ("image/", "video/")


@dataclass
class Slot:
    """One upload slot: the presigned fields and, once posted, the file."""

    token: str
    filename: str
    fields: dict[str, str]
    runway_uri: str
    expires_at: float
    data: bytes | None = None
    content_type: str = ""
    metadata: str | None = field(default=None)


class Uploads:
    """The slots handed out by ``POST /v1/uploads`` and the files posted to them."""

    def __init__(self, secret: str, max_bytes: int, ttl_s: float = SLOT_TTL_S) -> None:
        self._secret = secret.encode()
        self._max_bytes = max_bytes
        self._ttl_s = ttl_s
        self._slots: dict[str, Slot] = {}
        self._by_uri: dict[str, Slot] = {}

    def clear(self) -> None:
        self._slots.clear()
        self._by_uri.clear()

    def create(self, filename: str) -> Slot:
        token = secrets.token_hex(12)
        key = f"ephemeral/{token}/{filename}"
        policy = secrets.token_urlsafe(24)
        signature = hmac.new(self._secret, f"{key}\n{policy}".encode(), hashlib.sha256).hexdigest()
        fields = {"key": key, "policy": policy, "x-amz-signature": signature}
        slot = Slot(token, filename, fields, f"runway://{token}", time.time() + self._ttl_s)
        self._slots[token] = slot
        self._by_uri[slot.runway_uri] = slot
        return slot

    def complete(self, runway_uri: str) -> bool:
        """Whether `runway_uri` names an uploaded, unexpired file."""
        slot = self._by_uri.get(runway_uri)
        return slot is not None and slot.data is not None and slot.expires_at > time.time()

    def file(self, runway_uri: str) -> Slot | None:
        return self._by_uri.get(runway_uri)

    def receive(self, request: Request) -> Response:
        """Check the posted form against the slot and keep the file; 204 like S3."""
        slot = self._slots.get(request.params.get("token", ""))
        if slot is None or slot.expires_at < time.time():
            return _s3_error(403, "AccessDenied", "Request has expired or the key is unknown")
        form = parse_multipart(request.header("content-type") or "", request.body)
        if form is None:
            return _s3_error(400, "MalformedPOSTRequest", "The body is not multipart/form-data")
        for name, value in slot.fields.items():
            if form.get(name, (None, b""))[1] != value.encode():
                return _s3_error(403, "AccessDenied", f"Invalid according to Policy: {name}")
        if "file" not in form:
            return _s3_error(400, "InvalidArgument", "POST requires exactly one file upload")
        content_type, data = form["file"]
        if not content_type.startswith(UPLOAD_TYPES):
            return _s3_error(
                400, "InvalidArgument", f"Policy Condition failed: Content-Type {content_type}"
            )
        if len(data) > self._max_bytes:
            return _s3_error(400, "EntityTooLarge", "Your proposed upload exceeds the limit")
        slot.data, slot.content_type = data, content_type
        if "metadata" in form:
            slot.metadata = form["metadata"][1].decode("utf-8", "replace")
        return Response.empty(204)


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str, bytes]] | None:
    """``multipart/form-data`` -> {name: (content type, bytes)}; None when it is not one."""
    if not content_type.lower().startswith("multipart/form-data"):
        return None
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body
    )
    if not message.is_multipart():
        return None
    parts: dict[str, tuple[str, bytes]] = {}
    for part in message.iter_parts():
        assert isinstance(part, Message)
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        parts[name] = (part.get_content_type(), payload if isinstance(payload, bytes) else b"")
    return parts


def validate_upload_request(body: Any) -> list[dict[str, Any]]:
    """Zod-style issues of a ``POST /v1/uploads`` body (empty list = valid)."""
    if not isinstance(body, dict):
        return [{"code": "invalid_type", "expected": "object", "path": [], "message": "object"}]
    issues: list[dict[str, Any]] = []
    filename = body.get("filename")
    if not isinstance(filename, str) or not filename.strip():
        issues.append(
            {
                "code": "invalid_type",
                "expected": "string",
                "path": ["filename"],
                "message": "Invalid input: expected string",
            }
        )
    if body.get("type") != "ephemeral":
        issues.append(
            {
                "code": "invalid_value",
                "values": ["ephemeral"],
                "path": ["type"],
                "message": 'Invalid option: expected one of "ephemeral"',
            }
        )
    unknown = sorted(set(body) - {"filename", "type"})
    if unknown:
        issues.append(
            {
                "code": "unrecognized_keys",
                "keys": unknown,
                "path": [],
                "message": "Unrecognized keys: " + ", ".join(f'"{k}"' for k in unknown),
            }
        )
    return issues


def _s3_error(status: int, code: str, message: str) -> Response:
    body = (
        "<?xml version='1.0' encoding='UTF-8'?>"
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    )
    return Response(status, body.encode(), [("content-type", "application/xml")])
