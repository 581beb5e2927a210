"""A control plane SIGKILLed after committing an attempt SUBMITTING but before its Submit reached
the sidecar: on the shipped configuration (the sidecar is its accounts' sole submitter) the
restarted control plane gets NOT_FOUND from the submit journal and the task succeeds with one
provider job, instead of ending ABANDONED because Runway's real API cannot list tasks.

The moment is made deterministic with a TCP relay between the control plane and the Runway
sidecar: from the first chunk that carries a Submit (only SubmitRequest holds the callback URL)
on, what the control plane writes goes nowhere (a Submit that had not yet left the process);
the control plane is killed with its Submit held, and the held bytes die with its connection.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, describe, wait_for
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


class HoldingRelay:
    """A TCP relay to `target` that, once armed, swallows what its clients send from the first
    chunk containing a marker on."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.marker = b""
        self.holding = False
        self.held_bytes = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        tail = b""
        try:
            while data := source.recv(65536):
                with self._lock:
                    if upstream and self.marker and self.marker in tail + data:
                        self.holding = True
                    swallow = upstream and self.holding
                    self.held_bytes += len(data) if swallow else 0
                    tail = data[-len(self.marker) :] if self.marker else b""
                if not swallow:
                    sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):  # either side gone: the pair is gone, held bytes with it
            sock.close()

    def hold_from(self, marker: bytes) -> None:
        with self._lock:
            self.marker, self.held_bytes = marker, 0

    def release(self) -> None:
        with self._lock:
            self.marker, self.holding = b"", False

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for sock in self._open:
                sock.close()


@pytest.mark.timeout(300)
def test_a_submit_killed_before_it_left_is_proven_absent_and_resubmitted_once(
    farm: ProviderFarm, fresh_postgres_url: str, redis_db: RedisDb, tmp_path: Path
) -> None:
    """The attempt whose Submit never reached the sidecar ends FAILED PROVEN_ABSENT (submit
    journal), the task is requeued on the same candidate and SUCCEEDS, and Runway's truth holds
    exactly one job for the task."""
    routes = dict(item.split("=", 1) for item in farm.adapters_env.split(","))
    relay = HoldingRelay(routes["runway"])
    routes["runway"] = relay.address
    cp = ControlPlane(
        tmp_path / "cp",
        farm,
        database_url=fresh_postgres_url,
        redis_url=redis_db.url,
        env={"VIDROUTE_ADAPTERS": ",".join(f"{k}={v}" for k, v in routes.items())},
    )
    (tmp_path / "cp").mkdir()
    prompt = "a submit that never left"
    try:
        cp.start()
        relay.hold_from(b"/callbacks/runway?attempt=")
        task_id = cp.create_task("runway", prompt=prompt)
        # The Submit went into the relay, not to the sidecar: held, and no job anywhere.
        wait_for(lambda: relay.holding, timeout_s=30, interval_s=0.02, what="held Submit")
        cp.wait_attempt_state(task_id, {sp.ATTEMPT_STATE_SUBMITTING})
        cp.kill()
        wait_for(lambda: not cp.alive(), timeout_s=10, interval_s=0.02, what="control plane dead")
        relay.release()
        assert farm.truth("runway") == []
        cp.start()
        task = cp.wait_terminal(task_id, timeout_s=120)
        shown = describe(task)
        assert task.state == sp.TASK_STATE_SUCCEEDED, shown
        first, *rest = task.attempts
        assert first.state == sp.ATTEMPT_STATE_FAILED, shown
        assert first.error.code == "PROVEN_ABSENT", shown
        assert "submit_journal" in first.error.message, shown
        assert [a.state for a in rest] == [sp.ATTEMPT_STATE_SUCCEEDED], shown
        jobs = [j for j in farm.truth("runway") if prompt in str(j)]
        assert len(jobs) == 1, jobs
        assert rest[0].provider_job.provider_job_id == jobs[0]["id"], shown
        assert cp.stop() == 0, cp.logs()
    finally:
        cp.kill()
        relay.close()
