"""Google Cloud labels that carry our attempt identity (Vertex AI requests, issues 23 and 24).

The Vertex Veo adapter sends them on every create call, Google copies a request's labels onto
its Cloud Billing export rows, and reconciliation attributes those rows to the attempt whose
client request key the label names. One definition for both sides, so they cannot drift.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["ACCOUNT_LABEL", "ATTEMPT_LABEL", "label_value"]

#: Label keys (Cloud label keys start with a lower-case letter).
ATTEMPT_LABEL = "vidroute-request-key"  # the attempt's client request key
ACCOUNT_LABEL = "vidroute-account"  # our provider account's name

_LABEL_OK = re.compile(r"[a-z0-9_-]{0,63}")
_LABEL_BAD = re.compile(r"[^a-z0-9_-]+")


def label_value(text: str) -> str:
    """`text` as a Cloud label value: lowercase, at most 63 chars of ``[a-z0-9_-]``.

    A value that already obeys the rules is kept as is (a client request key,
    ``{task}-{attempt}-{12 hex}``, always does); any other is lowercased, its illegal runs
    replaced by ``-`` and suffixed with 12 hex digits of the original's SHA-256, so two
    different keys never share a label and a key's label can be recomputed from the key."""
    if _LABEL_OK.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    cleaned = _LABEL_BAD.sub("-", text.lower())
    return f"{cleaned[: 63 - 13]}-{digest}"
