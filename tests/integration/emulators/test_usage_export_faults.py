"""Usage-export faults (admin route ``/__emulator/usage/faults``): each falsifies the provider's
export the way a real bill goes wrong, and only for the job it names (design 9.23.4)."""

from __future__ import annotations

from typing import Any

import httpx

from adapter_sidecars.emulators.runway import RunwayConfig, RunwayEmulator
from adapter_sidecars.emulators.selfhosted import SelfHostedConfig, SelfHostedEmulator
from adapter_sidecars.emulators.veo import VeoConfig, VeoEmulator

from .conftest import RUNWAY_HEADERS, T2V_BODY, client, eventually

VEO_KEY = {"x-goog-api-key": "AIza-test"}
VEO_MODEL = "veo-3.1-generate-preview"
VEO_BODY: dict[str, Any] = {
    "instances": [{"prompt": "A lighthouse at dusk"}],
    "parameters": {"aspectRatio": "16:9", "durationSeconds": 8},
}
FAST = {"advance": "time", "queue_s": 0.0, "run_s": 0.05, "tick_s": 0.01}


async def _faults(c: httpx.AsyncClient, body: Any) -> httpx.Response:
    return await c.post("/__emulator/usage/faults", json=body)


async def test_runway_daily_total_shows_duplicate_price_and_failed_charge() -> None:
    async with RunwayEmulator(RunwayConfig(**FAST)) as emu, client(emu.url) as c:  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them
        ids = [
            (
                await c.post(
                    "/v1/text_to_video",
                    json={**T2V_BODY, "promptText": f"p{i}"},
                    headers=RUNWAY_HEADERS,
                )
            ).json()["id"]
            for i in range(3)
        ]
        emu.jobs[ids[2]].faults.fail = ("INTERNAL.BAD_OUTPUT", "bad output")

        async def done() -> bool:
            return all(emu.jobs[i].phase.terminal for i in ids)

        await eventually(done)

        async def total() -> int:
            body = (await c.post("/v1/organization/usage", json={}, headers=RUNWAY_HEADERS)).json()
            return sum(u["amount"] for r in body["results"] for u in r["usedCredits"])

        assert await total() == 2 * 60  # 12 credits/s x 5 s, the failed task refunded
        assert (await _faults(c, {"kind": "duplicate", "job_id": ids[0]})).status_code == 201
        assert await total() == 3 * 60
        await _faults(c, {"kind": "price", "job_id": ids[1], "unit_price": 15})
        assert await total() == 2 * 60 + 75
        await _faults(c, {"kind": "charge_failed", "job_id": ids[2]})
        assert await total() == 3 * 60 + 75
        refused = await _faults(c, {"kind": "conversion", "job_id": ids[0], "micros_per_unit": 1})
        assert refused.status_code == 400  # credits only: no conversion to falsify
        unknown = await _faults(c, {"kind": "duplicate", "job_id": "no-such-job"})
        assert unknown.status_code == 400


async def test_veo_billing_lines_duplicate_price_orphan() -> None:
    config = VeoConfig(**FAST, extensions=frozenset({"billing_export"}))  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them
    async with VeoEmulator(config) as emu, client(emu.url) as c:
        submit = f"/v1beta/models/{VEO_MODEL}:predictLongRunning"
        names = [
            (await c.post(submit, json=VEO_BODY, headers=VEO_KEY)).json()["name"] for _ in range(2)
        ]

        async def done() -> bool:
            return all(j.phase.terminal for j in emu.jobs.values())

        await eventually(done)
        first, second = names  # an operation name is its job id
        await _faults(
            c,
            [
                {"kind": "duplicate", "job_id": first},
                {"kind": "price", "job_id": second, "unit_price": "0.25"},
                {"kind": "orphan", "model": VEO_MODEL, "seconds": 6, "usd": 2.4, "ref": "ghost"},
            ],
        )
        rows = (await c.get("/v1beta/__billing/usage", headers=VEO_KEY)).json()["rows"]
        by_op = sorted((r["operation"], r["billedSeconds"], r["usd"]) for r in rows)
        assert by_op == sorted(
            [(first, 8, 3.2), (first, 8, 3.2), (second, 8, 2.0), ("ghost", 6.0, 2.4)]
        )


async def test_selfhosted_rows_carry_chargeback_and_falsified_conversion() -> None:
    config = SelfHostedConfig(advance="time", queue_s=0.0, speed=0.001, workers=2)
    async with SelfHostedEmulator(config) as emu, client(emu.url) as c:
        body = {
            "model": "wan2.2-t2v",
            "prompt": "a red kite",
            "duration_s": 2,
            "resolution": "720p",
            "aspect_ratio": "16:9",
        }
        ids = [
            (await c.post("/v1/jobs", json={**body, "prompt": f"k{i}"})).json()["id"]
            for i in range(2)
        ]

        async def done() -> bool:
            return all(emu.jobs[i].phase.terminal for i in ids)

        await eventually(done)
        await _faults(c, {"kind": "conversion", "job_id": ids[1], "micros_per_unit": 500})
        rows = (await c.get("/v1/usage", params={"start": "2000-01-01T00:00:00Z"})).json()["rows"]
        cost = {r["job_id"]: (r["gpu_seconds"], r["cost_micros"]) for r in rows}
        assert cost == {ids[0]: (26.0, 26 * 350), ids[1]: (26.0, 26 * 500)}
        assert (await _faults(c, {"kind": "price", "job_id": ids[0]})).status_code == 400
