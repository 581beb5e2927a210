"""The alerting rules of design 9.24 (`k8s/monitoring/alerts.yaml`) are sound without Prometheus.

Parsed here: every rule is an alert with a severity, a summary and a description, and every
metric its expression reads is a family the control plane or a sidecar exports (so renaming a
family breaks this test, not a silent alert). With promtool available (``promtool`` on the PATH
or ``VIDROUTE_PROMTOOL``; Debian's ``prometheus`` package ships it) the file also passes
``promtool check rules`` and the series-in/alerts-out cases of ``alerts.test.yaml``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter_sidecars.common.metrics import SidecarMetrics
from controlplane.metrics import ControlPlaneMetrics
from controlplane.metrics_state import StateSources

MONITORING = Path(__file__).resolve().parents[2] / "k8s" / "monitoring"
RULES = MONITORING / "alerts.yaml"
SEVERITIES = {"page", "ticket"}
# The high-priority alerts of 9.24 this file covers.
REQUIRED = {
    "VidrouteSubmitUnknownSpike",
    "VidrouteProvider5xxAndTimeouts",
    "VidrouteLeaseDriftGrowing",
    "VidrouteFailoverRateHigh",
    "VidrouteCostPerSuccessOverBudget",
    "VidrouteBillUnmatchedCharges",
    "VidrouteSafetyFailureRateShift",
    "VidrouteGenerationLatencyOverBaseline",
}
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "abs", "by", "without", "and",
    "or", "unless", "offset", "on", "ignoring", "group_left", "group_right", "clamp_min",
    "clamp_max", "histogram_quantile", "avg_over_time", "max_over_time", "le", "bool",
}  # fmt: skip


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def exported_series() -> set[str]:
    """Every series name the two deployables can expose (histogram parts included); the
    control plane's scrape-time families too, as a serving replica registers them."""
    names: set[str] = set()
    serving = ControlPlaneMetrics(state=StateSources())
    for registry in (serving.registry, SidecarMetrics("p").registry):
        for family in registry.collect():
            if family.type == "counter":
                names.add(f"{family.name}_total")
            elif family.type == "histogram":
                names |= {f"{family.name}_{part}" for part in ("bucket", "sum", "count")}
            else:
                names.add(family.name)
    return names


def metric_names(expr: str) -> set[str]:
    """Identifiers of `expr` that are not PromQL words, label names or string contents."""
    without_strings = re.sub(r'"[^"]*"', "", expr)
    without_labels = re.sub(r"\{[^}]*\}", "", without_strings)
    without_groupings = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_labels)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_groupings)
    tokens = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", without_ranges))
    return {t for t in tokens if t not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhdw]", t)}


def test_the_high_priority_alerts_are_there() -> None:
    assert {r["alert"] for r in rules()} >= REQUIRED


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_every_rule_has_severity_summary_and_known_families(rule: dict[str, Any]) -> None:
    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule["annotations"]["summary"].strip()
    assert rule["annotations"]["description"].strip()
    names = metric_names(rule["expr"])
    assert names, rule["expr"]
    assert names <= exported_series(), names - exported_series()


def test_the_family_check_is_not_a_rubber_stamp() -> None:
    assert metric_names('sum by (provider) (rate(provider_submit_totl{outcome="X"}[5m]))') == {
        "provider_submit_totl"
    }
    assert "provider_submit_totl" not in exported_series()


def _promtool() -> str | None:
    return os.environ.get("VIDROUTE_PROMTOOL") or shutil.which("promtool")


@pytest.mark.skipif(_promtool() is None, reason="promtool not installed (Debian: prometheus)")
@pytest.mark.parametrize(
    "command", [["check", "rules", "alerts.yaml"], ["test", "rules", "alerts.test.yaml"]]
)
def test_promtool_accepts_the_rules(command: list[str]) -> None:
    promtool = _promtool()
    assert promtool is not None
    done = subprocess.run(
        [promtool, *command],
        check=False,
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_bill_alert_reads_discrepancies_by_kind_not_the_net_delta() -> None:
    """The bill alert counts discrepancy rows per provider and kind (an offsetting duplicate
    and missing charge both fire; promtool's case in alerts.test.yaml), never the net delta."""
    [rule] = [r for r in rules() if r["alert"] == "VidrouteBillUnmatchedCharges"]
    names = metric_names(rule["expr"])
    assert names == {"provider_reconciliation_discrepancies_total"}, names
    assert re.search(r"by \(provider, kind\)", rule["expr"]), rule["expr"]
    cases = (MONITORING / "alerts.test.yaml").read_text(encoding="utf-8")
    for kind in ("DUPLICATE_CHARGE", "LOCAL_SUCCESS_WITHOUT_CHARGE"):
        assert (
            f'provider_reconciliation_discrepancies_total{{provider="runway",kind="{kind}"}}'
            in cases
        )
