"""Golden files of design 9.25.2: the native request each typical spec compiles to.

A golden file ``<goldens-dir>/<adapter>/<case>.golden.json`` holds the spec, the native request
JSON, every transformation and the estimated cost, exactly as the adapter produced them. A
provider SDK upgrade or a mapping change shows up as a diff of this file. Goldens are only
ever written by running the real adapter with ``--vidroute-update-goldens``, never by hand.

Goldens do not depend on the deployment: when the profile leaves ``account`` empty (the
adapter's default account), the plan's account is recorded as `DEFAULT_ACCOUNT` (after checking
the adapter named one), so the same goldens pass against a sidecar configured with any account
name — the example config's ``prod-us`` as well as CI's ``contract``.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from adapter_sidecars.contract.driver import AdapterDriver, spec_from_json
from adapter_sidecars.contract.profile import GOLDEN_CASE_MODES, PROFILES_DIR, AdapterProfile
from vidroute.adapter.v1 import adapter_pb2

FORMAT_VERSION = 1
#: What a golden records as the account when the profile uses the adapter's default account.
DEFAULT_ACCOUNT = "<adapter default account>"
#: The goldens of the built-in profiles in a source checkout (absent from an installed wheel).
CHECKOUT_GOLDENS = Path(__file__).resolve().parents[2] / "tests" / "testdata"


def goldens_root(explicit: str | None, rootdir: Path, profile: AdapterProfile) -> Path:
    """Where ``<adapter>/<case>.golden.json`` live: `explicit`, else ``<rootdir>/tests/testdata``;
    for a built-in profile whose goldens are not there, the source checkout's folder."""
    if explicit:
        return Path(explicit)
    root = rootdir / "tests" / "testdata"
    built_in = (PROFILES_DIR / f"{profile.name}.yaml").exists()
    if (
        built_in
        and not (root / profile.name).is_dir()
        and (CHECKOUT_GOLDENS / profile.name).is_dir()
    ):
        return CHECKOUT_GOLDENS
    return root


def _pretty(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def plan_document(
    case: str, spec: dict[str, Any], plan: adapter_pb2.CompilePlan, account: str = ""
) -> dict[str, Any]:
    """The golden content of one compiled case (stable key order, money as integers).

    `account` is the profile's account: "" (the adapter's default) records `DEFAULT_ACCOUNT`.
    """
    return {
        "format": FORMAT_VERSION,
        "case": case,
        "spec": spec,
        "plan": {
            "provider": plan.provider,
            "account": plan.account if account else DEFAULT_ACCOUNT,
            "model": plan.model,
            "model_version": plan.model_version,
            "capability_version": plan.capability_version,
            "price_version": plan.price_version,
            "endpoint": plan.endpoint,
            "native_request": json.loads(plan.native_request_json or "null"),
            "request_hash": plan.request_hash,
            "transformations": [
                {
                    "field": t.field,
                    "kind": adapter_pb2.TransformationKind.Name(t.kind).removeprefix(
                        "TRANSFORMATION_KIND_"
                    ),
                    "detail": t.detail,
                }
                for t in plan.transformations
            ],
            "estimated_cost": {
                "amount_micros": plan.estimated_cost.amount_micros,
                "currency_code": plan.estimated_cost.currency_code,
            },
            "submittable": plan.submittable,
        },
    }


class GoldenBook:
    """Checks (or, with ``update``, rewrites) the golden files of one adapter."""

    def __init__(
        self, adapter: AdapterDriver, folder: Path, update: bool, written: list[Path]
    ) -> None:
        self.adapter = adapter
        self.folder = folder
        self.update = update
        self._written = written

    def path(self, case: str) -> Path:
        return self.folder / f"{case}.golden.json"

    def check(self, case: str) -> None:
        """Compile the case and compare with its golden file; AssertionError shows the diff."""
        profile = self.adapter.profile
        spec = profile.golden_spec_json(case)
        model = profile.model_for(GOLDEN_CASE_MODES[case])
        plan = self.adapter.compile(spec_from_json(spec), model)
        assert plan.submittable, f"golden case {case} must compile to a submittable plan"
        assert plan.account, f"golden case {case}: the plan names no account"
        if profile.account:
            assert plan.account == profile.account, (plan.account, profile.account)
        current = _pretty(plan_document(case, spec, plan, profile.account))
        path = self.path(case)
        if self.update:
            if not path.exists() or path.read_text(encoding="utf-8") != current:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(current, encoding="utf-8")
                self._written.append(path)
            return
        assert path.exists(), (
            f"no golden file {path}; create it from the adapter with --update-goldens (pytest: "
            "--vidroute-update-goldens) and review the result before committing it"
        )
        expected = path.read_text(encoding="utf-8")
        if expected != current:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(keepends=True),
                    current.splitlines(keepends=True),
                    fromfile=f"{path} (golden)",
                    tofile=f"{case} (adapter now)",
                )
            )
            raise AssertionError(
                f"the adapter's native request for {case} changed; if intended, rerun with "
                f"--update-goldens (pytest: --vidroute-update-goldens) and commit the diff:\n{diff}"
            )
