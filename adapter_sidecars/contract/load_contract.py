"""Contract of GetLoad (design 9.21): the model-server load routing reads.

Every adapter answers GetLoad; an adapter whose provider exposes no load (a SaaS API) answers an
empty list, never an error, and one that reports load reports it sanely: only models it declares
in Describe, each once, fractions in 0..1, free VRAM within the total, a non-negative cold start,
and when it was measured. No capability flag selects these: the empty answer is the contract of
an adapter without load.
"""

from __future__ import annotations

import time

from adapter_sidecars.contract.driver import AdapterDriver
from vidroute.adapter.v1 import adapter_service_pb2


class LoadContract:
    """GetLoad answers, empty or with sane per-model load."""

    def _load(self, adapter: AdapterDriver) -> adapter_service_pb2.GetLoadResponse:
        return adapter.stub.GetLoad(
            adapter_service_pb2.GetLoadRequest(), timeout=adapter.rpc_timeout_s
        )

    def test_get_load_answers_empty_or_sane(self, adapter: AdapterDriver) -> None:
        """GetLoad succeeds; each reported model is declared in Describe, once, with
        utilisation in [0, 1], free VRAM <= total, cold start >= 0 and a measurement time."""
        reply = self._load(adapter)
        declared = {
            e.model
            for e in adapter.stub.Describe(
                adapter_service_pb2.DescribeRequest(), timeout=adapter.rpc_timeout_s
            ).capabilities
        }
        models = [m.model for m in reply.models]
        assert len(models) == len(set(models)), f"a model reported twice: {models}"
        assert set(models) <= declared, f"load for undeclared models {set(models) - declared}"
        for m in reply.models:
            assert 0.0 <= m.gpu_utilization <= 1.0, (
                f"{m.model}: gpu_utilization {m.gpu_utilization}"
            )
            assert m.vram_free_mb <= m.vram_total_mb, f"{m.model}: free VRAM above the total"
            assert m.cold_start_seconds >= 0.0, f"{m.model}: negative cold start"
        if reply.models:
            assert reply.HasField("observed_at"), "load reported without observed_at"
            age = time.time() - reply.observed_at.ToNanoseconds() / 1e9
            assert -60.0 < age < 300.0, f"load measured {age:.0f} s ago"

    def test_get_load_is_a_read(self, adapter: AdapterDriver) -> None:
        """Two GetLoads in a row report the same models: reading load changes nothing."""
        first = sorted(m.model for m in self._load(adapter).models)
        assert sorted(m.model for m in self._load(adapter).models) == first
