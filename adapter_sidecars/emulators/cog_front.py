"""A fault-injecting front of a REAL Cog server, for the contract suite (issue 24).

Not an emulator of Cog: every prediction runs on a real Cog server (coglet, started here as a
child process with the repository's models/cog_video predictor, or one at ``--upstream``).
The front sits between the sidecar and that server and adds what the contract suite needs
around it, through the shared `Emulator` machinery:

* the transport faults of 9.17.3 on ``PUT /predictions/*`` (delay, drops, stalls, corrupt or
  id-less bodies, statuses), applied by the base class before or after the real server answered;
* truth from the server's own log: one job per ``"Starting prediction"`` line since the last
  reset (a second run of an id is a second job; a prediction the server just answered 202 for
  counts before its line appears), the body the sidecar sent (minus the webhook delivery
  fields), and the phase the server reported in its webhooks;
* webhooks relayed: the sidecar's ``webhook`` is replaced by ``/relay/{id}`` on the front, which
  forwards each one (headers kept) to the sidecar's URL, so the truth learns the outcome;
* ``fail_job``: the predictor's own failure switch (``fail_with`` input, a real exception in
  the model), set on the forwarded request only. ``run_seconds_per_output_second`` holds each
  run that long per output second (the predictor's ``seconds_per_output_second``), so cancels
  meet a running prediction.

``python -m adapter_sidecars.emulators.cog_front --port 0`` prints ``listening on URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from adapter_sidecars.emulators.core import Emulator, EmulatorConfig
from adapter_sidecars.emulators.http import Request, Response
from adapter_sidecars.emulators.runner import main as run_main

_PHASES = {
    "starting": "queued",
    "processing": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "canceled": "cancelled",
}
_DELIVERY_FIELDS = ("webhook", "webhook_events_filter")


def _phase(payload: dict[str, Any]) -> str:
    """The phase a webhook reports. coglet 0.23 ends a run whose cancel arrived before the
    predictor's coroutine started as ``failed`` with its ``CancelationException``: the cancel
    stopped that run, so the server's truth is a cancelled job."""
    if payload["status"] == "failed" and "CancelationException" in str(payload.get("error")):
        return "cancelled"
    return _PHASES[str(payload["status"])]


@dataclass(frozen=True)
class CogFrontConfig(EmulatorConfig):
    """upstream: a running Cog server's URL ("" = start one here). predictor: its predict.py
    ("" = models/cog_video). webhook_token: the server's WEBHOOK_AUTH_TOKEN. cog_log: the
    upstream server's log file (required with upstream). run_seconds_per_output_second: held
    GPU time per output second. max_concurrency: predictions the server runs at once
    (COG_MAX_CONCURRENCY; a provider that takes several jobs, as the suite assumes)."""

    upstream: str = ""
    predictor: str = ""
    webhook_token: str = ""
    cog_log: str = ""
    run_seconds_per_output_second: float = 0.0
    max_concurrency: int = 4


class CogFront(Emulator):
    """See the module docstring."""

    name = "cog_front"

    def __init__(self, config: CogFrontConfig) -> None:
        self.front = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = Path(config.cog_log) if config.cog_log else None
        self._upstream = config.upstream.rstrip("/")
        self._sent: dict[str, dict[str, Any]] = {}
        self._hooks: dict[str, str] = {}  # prediction id -> the sidecar's webhook URL
        self._phase: dict[str, str] = {}
        self._accepted: dict[str, None] = {}  # ordered set of ids the server answered 2xx
        self._offset = 0
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0))
        super().__init__(config)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        if not self._upstream:
            self._start_cog()
        return await super().start(host, port)

    async def stop(self) -> None:
        await super().stop()
        await self._client.aclose()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)

    def _start_cog(self) -> None:
        from adapter_sidecars.selfhosted.cog_server import (
            DEFAULT_PREDICTOR,
            start_cog_server,
        )

        with contextlib.closing(__import__("socket").socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            cog_port = int(sock.getsockname()[1])
        workdir = Path(tempfile.mkdtemp(prefix="cog_front_"))
        self._log = workdir / "cog.log"
        predictor = Path(self.front.predictor) if self.front.predictor else DEFAULT_PREDICTOR
        self._proc = start_cog_server(
            cog_port,
            self._log,
            predictor=predictor,
            webhook_token=self.front.webhook_token,
            max_concurrency=self.front.max_concurrency,
        )
        self._upstream = f"http://127.0.0.1:{cog_port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if httpx.get(f"{self._upstream}/health-check", timeout=1).json()["status"] in (
                    "READY",
                    "BUSY",
                ):
                    return
            if self._proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the Cog server did not become READY; see {self._log}")

    # -- routes ------------------------------------------------------------------------------
    def install_routes(self) -> None:
        r = self.router
        r.add("PUT", "/predictions/{pid}", self._put)
        r.add("POST", "/predictions/{pid}/cancel", self._forward)
        r.add("GET", "/health-check", self._health)
        r.add("POST", "/relay/{pid}", self._relay)

    async def _put(self, request: Request) -> Response:
        pid = request.params["pid"]
        try:
            body = request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return await self._forward(request)
        self._sent[pid] = {k: v for k, v in body.items() if k not in _DELIVERY_FIELDS}
        forwarded = dict(body)
        if isinstance(body.get("webhook"), str):
            self._hooks[pid] = body["webhook"]
            forwarded["webhook"] = f"{self.url}/relay/{pid}"
        model_input = dict(forwarded.get("input") or {})
        for rule in request.context.get("job_faults", []):
            if rule.action == "fail_job":
                model_input["fail_with"] = str(rule.params["code"])
        if self.front.run_seconds_per_output_second:
            model_input["seconds_per_output_second"] = self.front.run_seconds_per_output_second
        forwarded["input"] = model_input
        response = await self._send(request, json.dumps(forwarded).encode())
        with contextlib.suppress(ValueError, AttributeError):
            if 200 <= response.status < 300 and response.json_body().get("status") in (
                "starting",
                "processing",
            ):
                self._accepted.setdefault(pid, None)  # the server took it: it will run
        return response

    async def _health(self, request: Request) -> Response:
        """Forwarded with ``Connection: close``: the sidecar probes every second, and a probe
        connection pooled while a ``refuse_connection`` fault starts would carry the next
        submit past the refusal (the front's forward makes that window wide)."""
        response = await self._forward(request)
        return Response(
            response.status, response.body, [*response.headers, ("connection", "close")]
        )

    async def _forward(self, request: Request) -> Response:
        return await self._send(request, request.body)

    async def _send(self, request: Request, body: bytes) -> Response:
        headers = {
            k: v for k, v in request.headers.items() if k in ("content-type", "prefer", "accept")
        }
        try:
            reply = await self._client.request(
                request.method, f"{self._upstream}{request.path}", content=body, headers=headers
            )
        except httpx.HTTPError as exc:
            return Response.json({"error": f"upstream: {type(exc).__name__}"}, 502)
        kept = [("content-type", reply.headers.get("content-type", "application/json"))]
        return Response(reply.status_code, reply.content, kept)

    async def _relay(self, request: Request) -> Response:
        pid = request.params["pid"]
        try:
            payload = request.json()
        except ValueError:
            payload = None
        if isinstance(payload, dict) and payload.get("status") in _PHASES:
            self._phase[pid] = _phase(payload)
        target = self._hooks.get(pid)
        if target is None:
            return Response.empty(404)
        headers = {
            k: v for k, v in request.headers.items() if k in ("content-type", "authorization")
        }
        try:
            reply = await self._client.post(target, content=request.body, headers=headers)
        except httpx.HTTPError:
            return Response.empty(502)  # coglet retries a terminal webhook
        return Response(reply.status_code, reply.content, [("content-type", "text/plain")])

    # -- truth -------------------------------------------------------------------------------
    def truth(self) -> list[dict[str, Any]]:
        """One job per run the server logged since the last reset."""
        jobs: list[dict[str, Any]] = []
        runs = self._runs()
        # A 202 precedes the server's "Starting prediction" line by a moment: an accepted
        # prediction counts from its acceptance (a repeated PUT of a running one adds nothing).
        for pid in [*runs, *(p for p in self._accepted if p not in runs)]:
            jobs.append(
                {
                    "id": pid,
                    "body": self._sent.get(pid),
                    "phase": self._phase.get(pid, "running"),
                    "deleted": False,
                    "idempotency_key": None,
                }
            )
        return jobs

    def _runs(self) -> list[str]:
        if self._log is None or not self._log.exists():
            return []
        with self._log.open("rb") as fh:
            fh.seek(self._offset)
            text = fh.read().decode("utf-8", "replace")
        runs: list[str] = []
        for line in text.splitlines():
            if "Starting prediction" not in line:
                continue
            with contextlib.suppress(ValueError, AttributeError):
                fields = json.loads(line).get("fields", {})
                if fields.get("message") == "Starting prediction":
                    runs.append(str(fields["prediction_id"]))
        return runs

    async def _admin_reset(self, request: Request) -> Response:
        """Reset once the server is idle: a run of the last test would refuse the next (409)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                reply = await self._client.get(f"{self._upstream}/health-check")
                if reply.json()["status"] == "READY":
                    break
            await asyncio.sleep(0.05)
        return await super()._admin_reset(request)

    def on_reset(self) -> None:
        self._sent.clear()
        self._hooks.clear()
        self._phase.clear()
        self._accepted.clear()
        self._offset = self._log.stat().st_size if self._log and self._log.exists() else 0


def main(argv: list[str] | None = None) -> int:
    """Serve the front (and its Cog server) until SIGTERM."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_main(CogFront, CogFrontConfig, argv)


if __name__ == "__main__":
    raise SystemExit(main())
