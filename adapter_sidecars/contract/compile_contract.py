"""Contract of Describe and Compile (design 9.25.1: 合法请求可以编译, 非法参数在提交前被拒绝,
默认值稳定) and the golden files of 9.25.2. Nothing here calls the provider except the check
that a refused plan creates no job.
"""

from __future__ import annotations

import fnmatch
import json
import re

import grpc
import pytest

from adapter_sidecars.contract.driver import (
    AdapterDriver,
    call_or_code,
    grpc_code,
    plan_to_json,
    spec_from_json,
)
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin
from adapter_sidecars.contract.golden import GoldenBook
from adapter_sidecars.contract.profile import merge
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2
from vidroute.common.v1 import generation_pb2

requires = pytest.mark.contract_requires

_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


def _kinds(plan: adapter_pb2.CompilePlan) -> list[str]:
    return [adapter_pb2.TransformationKind.Name(t.kind) for t in plan.transformations]


class DescribeContract:
    """Describe tells the router the truth the profile's capability flags assume."""

    def _entries(self, adapter: AdapterDriver) -> list[adapter_pb2.CapabilityEntry]:
        response = adapter.stub.Describe(adapter_service_pb2.DescribeRequest(), timeout=10)
        return list(response.capabilities)

    def test_every_profile_model_is_declared_for_its_mode(self, adapter: AdapterDriver) -> None:
        """Each model the profile uses appears in Describe with the mode the profile uses it for."""
        entries = self._entries(adapter)
        for mode, model in adapter.profile.models.items():
            modes = {m for e in entries if e.model == model for m in e.modes}
            assert getattr(generation_pb2, f"MODE_{mode}") in modes, (
                f"Describe does not declare {model} for {mode}; declared models: "
                f"{sorted({e.model for e in entries})}"
            )

    def test_declared_operations_match_profile_flags(self, adapter: AdapterDriver) -> None:
        """The operations Describe declares agree with the profile flags that select tests."""
        profile = adapter.profile
        want = {
            "cancellation": profile.supports_cancel,
            "client_idempotency_key": profile.supports_idempotency_key,
            "task_search": profile.supports_task_search,
            "usage_records": profile.supports_usage,
            "callback": profile.supports_callbacks,
        }
        for entry in self._entries(adapter):
            if entry.model not in profile.models.values():
                continue
            got = {name: getattr(entry.operations, name) for name in want}
            assert got == want, f"{entry.model}: Describe declares {got}, the profile says {want}"

    def test_entries_carry_versions_and_prices(self, adapter: AdapterDriver) -> None:
        """Every entry names its capability version and a priced, versioned Price (9.6.4)."""
        for entry in self._entries(adapter):
            assert entry.capability_version, f"{entry.model}: capability_version is empty"
            assert entry.price.price_version, f"{entry.model}: price.price_version is empty"
            assert entry.price.per_output_second.currency_code, (
                f"{entry.model}: price has no currency"
            )


class CompileContract:
    """Valid specs compile deterministically; invalid ones are stopped before any submit."""

    def test_valid_spec_compiles_to_a_submittable_plan(self, adapter: AdapterDriver) -> None:
        """The profile's base text-to-video spec compiles to a complete, submittable plan."""
        profile = adapter.profile
        plan = adapter.compile_json(profile.spec_json())
        assert plan.submittable, plan_to_json(plan)
        assert plan.model == profile.model_for("TEXT_TO_VIDEO")
        for name in ("provider", "capability_version", "price_version"):
            assert getattr(plan, name), f"plan.{name} is empty: {plan_to_json(plan)}"
        assert fnmatch.fnmatchcase(plan.endpoint, profile.submit_route), (
            f"plan.endpoint {plan.endpoint!r} does not match the profile's submit_route "
            f"{profile.submit_route!r}: submit fault rules would miss it"
        )
        assert _HASH.match(plan.request_hash), (
            f"request_hash {plan.request_hash!r} is not sha256:<hex>"
        )
        assert plan.estimated_cost.amount_micros > 0, plan_to_json(plan)
        assert plan.estimated_cost.currency_code, plan_to_json(plan)
        assert "TRANSFORMATION_KIND_REJECT" not in _kinds(plan)

    def test_native_request_is_canonical_json(self, adapter: AdapterDriver) -> None:
        """native_request_json is canonical JSON: sorted keys and no whitespace."""
        plan = adapter.compile_json(adapter.profile.spec_json())
        native = json.loads(plan.native_request_json)
        assert isinstance(native, dict), plan.native_request_json
        assert native, "the native request is empty"
        canonical = json.dumps(native, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert plan.native_request_json == canonical

    def test_compile_is_deterministic(self, adapter: AdapterDriver) -> None:
        """Compiling the same spec twice yields byte-identical plans and the same request_hash."""
        spec = adapter.profile.spec_json()
        first, second = adapter.compile_json(spec), adapter.compile_json(spec)
        assert first.SerializeToString(deterministic=True) == second.SerializeToString(
            deterministic=True
        )

    def test_request_hash_follows_the_request(self, adapter: AdapterDriver) -> None:
        """A different prompt gives a different request_hash (the hash is not a constant)."""
        profile = adapter.profile
        one = adapter.compile_json(profile.spec_json())
        other = adapter.compile_json(profile.spec_json({"prompt": "A red kite over a green field"}))
        assert one.request_hash != other.request_hash

    def test_defaults_explicit_or_implicit_compile_identically(
        self, adapter: AdapterDriver
    ) -> None:
        """Leaving fps, sample count, service class and routing mode at their defaults or
        spelling the defaults out gives the same plan and request_hash (默认值稳定)."""
        profile = adapter.profile
        implicit = adapter.compile_json(profile.spec_json())
        explicit = adapter.compile_json(
            profile.spec_json(
                {
                    "output": {"fps": 24, "sampleCount": 1},
                    "serviceClass": "SERVICE_CLASS_STANDARD",
                    "routing": {"mode": "ROUTING_MODE_AUTO"},
                    "priority": 0,
                }
            )
        )
        assert implicit.request_hash == explicit.request_hash
        assert implicit.native_request_json == explicit.native_request_json
        assert implicit.SerializeToString(deterministic=True) == explicit.SerializeToString(
            deterministic=True
        ), f"implicit {plan_to_json(implicit)}\nexplicit {plan_to_json(explicit)}"

    @requires("supports_image_to_video")
    def test_request_hash_ignores_asset_url_signatures(self, adapter: AdapterDriver) -> None:
        """Two signings of the same checksummed frame give the same request_hash (9.7.3)."""
        profile = adapter.profile
        spec = profile.golden_spec_json("image_to_video_portrait")
        uri = spec["firstFrame"]["objectUri"]
        hashes = set()
        for signature in ("aaa111", "bbb222"):
            signed_uri = f"{uri}?X-Amz-Expires=600&X-Amz-Signature={signature}"
            plan = adapter.compile_json(
                merge(spec, {"firstFrame": {"objectUri": signed_uri}}), mode="IMAGE_TO_VIDEO"
            )
            assert plan.submittable, plan_to_json(plan)
            hashes.add(plan.request_hash)
        assert len(hashes) == 1, f"request_hash changed with the URL signature: {hashes}"

    def test_unsupported_capability_compiles_to_reject(self, adapter: AdapterDriver) -> None:
        """A spec needing a capability the model lacks compiles to a REJECT, not submittable."""
        plan = adapter.compile_json(
            adapter.profile.spec_json(adapter.profile.unsupported_overrides)
        )
        assert not plan.submittable, plan_to_json(plan)
        rejected = [
            t for t in plan.transformations if t.kind == adapter_pb2.TRANSFORMATION_KIND_REJECT
        ]
        assert rejected, f"no REJECT transformation explains the refusal: {plan_to_json(plan)}"
        assert all(t.field and t.detail for t in rejected), plan_to_json(plan)

    def test_unsubmittable_plan_is_refused_and_creates_no_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """Submit of a non-submittable plan fails with INVALID_ARGUMENT/FAILED_PRECONDITION and
        never reaches the provider (no job in emulator truth, no submit request seen)."""
        plan = adapter.compile_json(
            adapter.profile.spec_json(adapter.profile.unsupported_overrides)
        )
        assert not plan.submittable
        code = grpc_code(lambda: adapter.submit(plan))
        assert code in _REFUSALS, f"Submit of an unsubmittable plan answered {code}"
        assert emulator.jobs() == []
        assert emulator.count_requests(adapter.profile.submit_route) == 0

    def test_malformed_spec_is_invalid_argument(self, adapter: AdapterDriver) -> None:
        """A spec without a mode is a malformed request: Compile fails with INVALID_ARGUMENT."""
        spec = adapter.profile.spec_json()
        spec.pop("mode")
        code = grpc_code(lambda: adapter.compile_json(spec))
        assert code == grpc.StatusCode.INVALID_ARGUMENT

    def test_unknown_model_is_refused_before_submit(self, adapter: AdapterDriver) -> None:
        """Compiling for a model the adapter does not know fails or yields an unsubmittable plan."""
        spec = spec_from_json(adapter.profile.spec_json())
        plan, code = call_or_code(lambda: adapter.compile(spec, "contract-no-such-model"))
        if code is not None:
            assert code in (*_REFUSALS, grpc.StatusCode.NOT_FOUND), code
        else:
            assert plan is not None
            assert not plan.submittable, plan_to_json(plan)


class RoutedCompileContract:
    """Compile against the entry the control plane routed on (CompileRequest.capability): the
    catalog's version and price compile, whatever the adapter's own files say, with the
    adapter's wire mapping; an entry that is not this request's, or a model the adapter cannot
    map, is refused."""

    def _routed(self, adapter: AdapterDriver) -> adapter_pb2.CapabilityEntry:
        """The Describe entry of the profile's text-to-video model, as the catalog holds it."""
        model = adapter.profile.model_for("TEXT_TO_VIDEO")
        response = adapter.stub.Describe(adapter_service_pb2.DescribeRequest(), timeout=10)
        entries = [e for e in response.capabilities if e.model == model]
        mine = [e for e in entries if e.account == adapter.profile.account] or entries
        assert mine, f"Describe has no entry of {model}"
        entry = adapter_pb2.CapabilityEntry()
        entry.CopyFrom(mine[0])
        return entry

    def _compile(
        self, adapter: AdapterDriver, entry: adapter_pb2.CapabilityEntry, model: str = ""
    ) -> adapter_pb2.CompilePlan:
        request = adapter_service_pb2.CompileRequest(
            spec=spec_from_json(adapter.profile.spec_json()),
            account=entry.account,
            model=model or entry.model,
            capability=entry,
        )
        reply: adapter_service_pb2.CompileResponse = adapter.stub.Compile(request, timeout=10)
        return reply.plan

    def test_a_newly_published_version_and_price_compile(self, adapter: AdapterDriver) -> None:
        """An entry under a capability version, model version and price the adapter's files
        never had compiles to a submittable plan carrying that version and priced at it."""
        entry = self._routed(adapter)
        base = self._compile(adapter, entry)
        entry.model_version = "2099-01-01"
        entry.capability_version = f"{entry.capability_version}+contract"
        entry.price.price_version = "contract-price"
        entry.price.per_output_second.amount_micros += 11
        plan = self._compile(adapter, entry)
        assert plan.submittable, plan_to_json(plan)
        assert (plan.model_version, plan.capability_version, plan.price_version) == (
            "2099-01-01",
            entry.capability_version,
            "contract-price",
        )
        assert plan.estimated_cost.amount_micros > base.estimated_cost.amount_micros
        # The wire mapping is the adapter's: the same spec sends the same body.
        assert plan.native_request_json == base.native_request_json

    def test_an_entry_for_another_model_is_invalid_argument(self, adapter: AdapterDriver) -> None:
        """A routed entry that is not the request's model is refused as a malformed request."""
        entry = self._routed(adapter)
        code = grpc_code(lambda: self._compile(adapter, entry, model="contract-other-model"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT

    def test_a_model_the_adapter_cannot_map_is_not_found(self, adapter: AdapterDriver) -> None:
        """A routed entry of a model the adapter has no wire mapping for (a typo in a published
        catalog) is NOT_FOUND, so a dry run's sample compile can name it."""
        entry = self._routed(adapter)
        entry.model = "contract-no-such-model"
        code = grpc_code(lambda: self._compile(adapter, entry))
        assert code == grpc.StatusCode.NOT_FOUND


class GoldenContract:
    """Each typical spec compiles to exactly the native request recorded in its golden file."""

    def test_text_to_video_16x9(self, golden_book: GoldenBook) -> None:
        """A 16:9 8 s text-to-video spec still compiles to its golden native request."""
        golden_book.check("text_to_video_16x9")

    @requires("supports_image_to_video")
    def test_image_to_video_portrait(self, golden_book: GoldenBook) -> None:
        """A 9:16 image-to-video spec still compiles to its golden native request."""
        golden_book.check("image_to_video_portrait")

    @requires("supports_first_last")
    def test_first_last_8s(self, golden_book: GoldenBook) -> None:
        """An 8 s first+last-frame spec still compiles to its golden native request."""
        golden_book.check("first_last_8s")
