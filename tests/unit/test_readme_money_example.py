"""The README's worked money example is computed from the shipped price records, not typed in."""

from __future__ import annotations

from pathlib import Path

from controlplane.domain.money import units_to_micros
from vidroute_core.capabilities.loader import load_file

ROOT = Path(__file__).resolve().parents[2]
RUNWAY = ROOT / "adapter_sidecars" / "runway" / "capabilities" / "runway-2026-06.yaml"


def test_the_gen4_turbo_example_matches_the_shipped_prices() -> None:
    """5 s of gen4_turbo: 250000 micros estimated, 25 credits, 25 x 10000 micros under the rate
    version the README names; the README states exactly these figures."""
    [cap] = [c for c in load_file(RUNWAY) if c.model == "gen4_turbo"]
    com = cap.commercial
    seconds = 5
    estimate = com.price_micros_per_output_second * seconds
    credits, rest = divmod(com.provider_milliunits_per_output_second * seconds, 1000)
    assert (estimate, credits, rest) == (250_000, 25, 0)
    assert units_to_micros(credits, com.micros_per_provider_unit) == estimate
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Money") : readme.index("## Configuration")]
    for fact in (
        f"Price version `{com.price_version}`",
        f"{com.price_micros_per_output_second:,} micros per output second".replace(",", " "),
        f"5 × {com.price_micros_per_output_second:,} = {estimate:,}".replace(",", " "),
        f"{com.micros_per_provider_unit:,} micros per".replace(",", " "),
        f"`RESERVE {estimate}`",
        f"`EXPECTED {estimate}`",
        f"`ACTUAL {estimate}`, {credits} `{com.provider_unit}`",
        f"conversion rate `{com.price_version}`",
        f"`CHARGE {estimate}`",
    ):
        assert fact in section, fact
