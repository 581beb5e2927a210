"""A small client for a provider emulator's admin API (``/__emulator/*``), used as ground truth.

The suite never trusts the adapter about what happened at the provider: it asks the emulator.
``jobs()`` lists every job the emulator really created, whatever the adapter reported.
Admin endpoints are never subject to faults, but ``refuse_connection`` closes the whole
listening socket for a while, so every call retries *connection* errors until a deadline.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

ADMIN = "/__emulator"


class EmulatorAdminError(RuntimeError):
    """The emulator answered an admin call with an error or could not be reached in time."""


class EmulatorAdmin:
    """Fault injection and truth of one emulator at `base_url`."""

    def __init__(
        self, base_url: str, timeout_s: float = 5.0, reach_deadline_s: float = 15.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._reach_deadline_s = reach_deadline_s
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EmulatorAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults ------------------------------------------------------------------------------
    def add_fault(self, action: str, route: str = "*", **params: Any) -> dict[str, Any]:
        """Add one rule, e.g. ``add_fault("status", "POST /v1/jobs", code=503)``; returns it."""
        rule = {"action": action, "route": route, **params}
        return self.add_faults([rule])[0]

    def add_faults(self, rules: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        body = self._call("POST", f"{ADMIN}/faults", json=list(rules))
        return list(body["faults"])

    def faults(self) -> list[dict[str, Any]]:
        """Every rule with its counters (``seen``, ``fired``, ``exhausted``)."""
        return list(self._call("GET", f"{ADMIN}/faults")["faults"])

    def clear_faults(self) -> None:
        self._call("DELETE", f"{ADMIN}/faults")

    # -- truth -------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """Every job the emulator really created, oldest first (deleted ones included)."""
        return list(self._call("GET", f"{ADMIN}/jobs")["jobs"])

    def job(self, job_id: str) -> dict[str, Any]:
        """The truth record of one job; raises when the emulator never created it."""
        for job in self.jobs():
            if job["id"] == job_id:
                return job
        raise EmulatorAdminError(f"the emulator has no job {job_id!r}")

    def callbacks(self) -> list[dict[str, Any]]:
        """Webhook delivery attempts (``job_id``, ``url``, ``payload``, ``status_code``)."""
        return list(self._call("GET", f"{ADMIN}/callbacks")["deliveries"])

    def request_counts(self) -> dict[str, int]:
        """Requests seen per ``"METHOD /path"`` since the last reset (admin calls excluded)."""
        return dict(self._call("GET", f"{ADMIN}/stats")["requests"])

    def count_requests(self, route: str) -> int:
        """Requests whose ``"METHOD /path"`` matches the fnmatch pattern `route`."""
        return sum(n for key, n in self.request_counts().items() if fnmatch.fnmatchcase(key, route))

    def reset(self) -> None:
        """Forget jobs, faults, usage and counters."""
        self._call("POST", f"{ADMIN}/reset")

    def wait_reachable(self, deadline_s: float | None = None) -> None:
        """Block until the admin API answers (e.g. after ``refuse_connection`` ends)."""
        self._call("GET", f"{ADMIN}/faults", deadline_s=deadline_s)

    # -- plumbing ----------------------------------------------------------------------------
    def _call(
        self, method: str, path: str, *, json: Any = None, deadline_s: float | None = None
    ) -> Any:
        deadline = time.monotonic() + (deadline_s or self._reach_deadline_s)
        while True:
            try:
                response = self._client.request(method, path, json=json)
                break
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if time.monotonic() >= deadline:
                    raise EmulatorAdminError(
                        f"emulator at {self.base_url} unreachable: {exc}"
                    ) from exc
                time.sleep(0.05)
        if response.status_code >= 400:
            raise EmulatorAdminError(
                f"{method} {path} -> HTTP {response.status_code}: {response.text[:500]}"
            )
        return response.json() if response.content else None
