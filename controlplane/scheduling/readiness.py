"""Is the capability catalog ready to route on? (design 9.6.4; issue 8 "not ready" rule)

A control plane that has not yet heard what its adapters offer must not route: to the router an
empty or partial catalog reads as "nobody can do this", and a task would fail with
NO_ELIGIBLE_CANDIDATE only because the sidecars came up a second later. So until the catalog
holds every entry each configured adapter described, the dispatcher skips its rounds (tasks stay
QUEUED) and health reports NOT_SERVING; ``liveness`` is not affected.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from controlplane.capabilities.catalog import CapabilityCatalog

Entry = tuple[str, str, str]  # (provider, account, model), as a catalog candidate names it


@dataclass
class CatalogReadiness:
    """The adapters that must have described themselves, and what each described."""

    adapters: frozenset[str] = frozenset()
    _described: dict[str, frozenset[Entry]] = field(default_factory=dict)

    def described(self, adapter: str, entries: Iterable[Entry]) -> None:
        """`adapter` answered Describe with `entries` (and they were published)."""
        self._described[adapter] = frozenset(entries)

    def problem(self, catalog: CapabilityCatalog | None) -> str | None:
        """Why `catalog` is not ready to route on, or None when it is."""
        if catalog is None:
            return "capability catalog not loaded yet"
        if not catalog.candidates:
            return "capability catalog is empty"
        waiting = sorted(self.adapters - self._described.keys())
        if waiting:
            return f"waiting for the capabilities of adapter(s) {', '.join(waiting)}"
        held = {(c.provider, c.account, c.model) for c in catalog.candidates}
        for adapter, entries in sorted(self._described.items()):
            missing = sorted(entries - held)
            if missing:
                provider, account, model = missing[0]
                return (
                    f"catalog lacks {len(missing)} entries adapter {adapter} describes "
                    f"(first: {provider}/{model}/{account})"
                )
        return None
