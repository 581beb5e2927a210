"""Contract of FetchOutput: outputs that need the provider's credentials to download.

Credentials never leave a sidecar, so an output URI the control plane cannot download itself
(Gemini file URIs need the API key) is flagged, and the control plane streams it through the
adapter's FetchOutput instead. The adapter must stream the bytes of its own outputs, map an
expired link to OUTPUT_EXPIRED, and refuse to fetch anything that is not the provider's (no
server-side request forgery through this RPC). Adapters whose outputs are signed URLs anyone
may GET must leave the flag unset.
"""

from __future__ import annotations

import grpc
import pytest

from adapter_sidecars.contract.driver import AdapterDriver, class_name, grpc_code, state_name
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2
from vidroute.common.v1 import error_pb2

requires = pytest.mark.contract_requires

SUCCEEDED = adapter_pb2.JOB_STATE_SUCCEEDED
#: The largest part FetchOutput may send.
CHUNK_BYTES = 64 * 1024
#: ISO-BMFF boxes an MP4 may open with (bytes 4..8).
MP4_BOXES = frozenset({b"ftyp", b"styp", b"moov", b"mdat", b"free", b"skip", b"wide"})


def _fetch(
    adapter: AdapterDriver, job: adapter_pb2.JobRef, uri: str, max_bytes: int = 0
) -> list[adapter_service_pb2.FetchOutputResponse]:
    request = adapter_service_pb2.FetchOutputRequest(job=job, uri=uri, max_bytes=max_bytes)
    return list(adapter.stub.FetchOutput(request, timeout=adapter.rpc_timeout_s * 3))


def _succeeded(adapter: AdapterDriver) -> tuple[adapter_pb2.JobRef, adapter_pb2.JobStatus]:
    job = adapter.accepted_job()
    final = adapter.poll_to_end(job)[-1]
    assert final.state == SUCCEEDED, state_name(final.state)
    assert final.outputs, "SUCCEEDED without outputs"
    return job, final


class FetchOutputContract:
    """Outputs flagged ``fetch_through_adapter`` download through FetchOutput, safely."""

    @requires("fetch_through_adapter")
    def test_flagged_output_streams_through_fetch_output(self, adapter: AdapterDriver) -> None:
        """Every output is flagged and FetchOutput streams a video: the content type on the
        first message, parts of at most 64 KiB, an MP4 body, no error."""
        job, final = _succeeded(adapter)
        for output in final.outputs:
            assert output.fetch_through_adapter, f"output not flagged: {output.uri}"
            replies = _fetch(adapter, job, output.uri)
            errors = [r.error for r in replies if r.HasField("error")]
            assert not errors, [f"{class_name(e.error_class)} {e.message}" for e in errors]
            assert replies[0].content_type.split(";")[0].strip() in ("video/mp4", "")
            assert all(len(r.chunk) <= CHUNK_BYTES for r in replies)
            body = b"".join(r.chunk for r in replies)
            assert body[4:8] in MP4_BOXES, f"body starts {body[:16]!r}"
            if replies[0].content_length:
                assert replies[0].content_length == len(body)

    @requires("fetch_through_adapter")
    def test_fetch_output_honours_max_bytes(self, adapter: AdapterDriver) -> None:
        """A body over the caller's max_bytes is not delivered: the stream ends with an error."""
        job, final = _succeeded(adapter)
        replies = _fetch(adapter, job, final.outputs[0].uri, max_bytes=64)
        assert replies[-1].HasField("error"), "no error for a body over max_bytes"
        assert sum(len(r.chunk) for r in replies) <= 64

    @requires("fetch_through_adapter")
    def test_fetch_output_refuses_uris_that_are_not_the_providers(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A URI on another host (cloud metadata, an internal service) or another scheme is
        INVALID_ARGUMENT: the sidecar's credentials and network position are not for hire."""
        job, _ = _succeeded(adapter)
        for uri in (
            "http://169.254.169.254/latest/meta-data/iam/",
            "http://127.0.0.1:1/internal",
            "file:///etc/passwd",
        ):
            code = grpc_code(lambda uri=uri: _fetch(adapter, job, uri))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{uri}: {code}"
        assert len(emulator.jobs()) == 1

    @requires("fetch_through_adapter", outcomes_from_webhooks=False)
    def test_expired_output_is_output_expired(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A link the provider no longer serves ends the stream with OUTPUT_EXPIRED (the control
        plane then re-reads the job; it never generates again)."""
        emulator.add_fault("expire_output", adapter.profile.submit_route)
        job, final = _succeeded(adapter)
        replies = _fetch(adapter, job, final.outputs[0].uri)
        last = replies[-1]
        assert last.HasField("error"), "an expired output streamed without error"
        assert last.error.error_class == error_pb2.ERROR_CLASS_OUTPUT_EXPIRED, class_name(
            last.error.error_class
        )

    @requires(fetch_through_adapter=False)
    def test_outputs_download_without_the_adapter(self, adapter: AdapterDriver) -> None:
        """Outputs of a provider whose links are signed URLs stay unflagged."""
        _, final = _succeeded(adapter)
        assert not any(o.fetch_through_adapter for o in final.outputs), [
            o.uri for o in final.outputs
        ]
