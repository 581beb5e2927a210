"""Fault rules: which request gets which failure.

A rule is JSON such as
``{"route": "POST /v1/text_to_video", "nth": 2, "action": "drop_after_body"}``.
Every rule whose route matches a request counts it (counting starts when the rule is added);
``nth`` fires on exactly the Nth match, otherwise the rule fires on the next ``times`` matches
(default 1). Of the rules that fire for one request, the first *transport* action is applied and
every *job* action attaches to the job the request creates or reads. ``refuse_connection`` is
*immediate*: it takes effect when added, whatever the route.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field
from typing import Any

TRANSPORT_ACTIONS = frozenset(
    {
        "delay_accept",
        "drop_after_partial_body",
        "drop_after_body",
        "stall_response",
        "corrupt_json",
        "missing_id",
        "status",
    }
)
JOB_ACTIONS = frozenset(
    {
        "throttle_polls",
        "unknown_status",
        "fail_job",
        "expire_output",
        "callback_twice",
        "callback_out_of_order",
        "callback_before_response",
    }
)
IMMEDIATE_ACTIONS = frozenset({"refuse_connection"})
REQUIRED_PARAMS: dict[str, tuple[str, ...]] = {
    "refuse_connection": ("duration_ms",),
    "delay_accept": ("ms",),
    "stall_response": ("seconds",),
    "status": ("code",),
    "throttle_polls": ("n",),
    "unknown_status": ("value",),
    "fail_job": ("code",),
}
_RULE_KEYS = frozenset({"route", "nth", "times", "action"})
_ids = itertools.count(1)


class FaultRuleError(ValueError):
    """A fault rule is malformed; the message says which field."""


@dataclass
class FaultRule:
    """One parsed rule plus its counters."""

    action: str
    route: str = "*"
    nth: int | None = None
    times: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_ids))
    seen: int = 0
    fired: int = 0

    @classmethod
    def from_json(cls, obj: Any) -> FaultRule:
        if not isinstance(obj, dict):
            raise FaultRuleError("a fault rule must be a JSON object")
        action = obj.get("action")
        known = TRANSPORT_ACTIONS | JOB_ACTIONS | IMMEDIATE_ACTIONS
        if action not in known:
            raise FaultRuleError(f"unknown action {action!r}; expected one of {sorted(known)}")
        params = {k: v for k, v in obj.items() if k not in _RULE_KEYS}
        for name in REQUIRED_PARAMS.get(action, ()):
            if name not in params:
                raise FaultRuleError(f"action {action!r} needs parameter {name!r}")
        nth, times = obj.get("nth"), obj.get("times", 1)
        for label, value in (("nth", nth), ("times", times)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise FaultRuleError(f"{label} must be a positive integer")
        route = obj.get("route", "*")
        if not isinstance(route, str):
            raise FaultRuleError("route must be a string like 'POST /v1/jobs'")
        return cls(action=action, route=route, nth=nth, times=times, params=params)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "route": self.route,
            "action": self.action,
            "nth": self.nth,
            "times": self.times,
            **self.params,
            "seen": self.seen,
            "fired": self.fired,
            "exhausted": self.exhausted,
        }

    @property
    def kind(self) -> str:
        if self.action in TRANSPORT_ACTIONS:
            return "transport"
        return "job" if self.action in JOB_ACTIONS else "immediate"

    @property
    def exhausted(self) -> bool:
        if self.nth is not None:
            return self.seen >= self.nth
        return self.fired >= self.times

    def matches(self, method: str, path: str) -> bool:
        route = self.route.strip()
        if route in ("", "*"):
            return True
        want_method, _, want_path = route.partition(" ")
        if want_method not in ("*", method):
            return False
        return fnmatch.fnmatchcase(path, want_path or "*")

    def offer(self, method: str, path: str) -> bool:
        """Count a request; return True when the rule fires for it."""
        if self.kind == "immediate" or self.exhausted or not self.matches(method, path):
            return False
        self.seen += 1
        fire = self.seen == self.nth if self.nth is not None else True
        if fire:
            self.fired += 1
        return fire


@dataclass
class Matched:
    """The faults that fire for one request."""

    transport: FaultRule | None = None
    job: list[FaultRule] = field(default_factory=list)


class FaultBook:
    """The ordered list of rules of one emulator."""

    def __init__(self) -> None:
        self.rules: list[FaultRule] = []

    def add(self, payload: Any) -> list[FaultRule]:
        """Parse and append a rule or a list of rules (all-or-nothing)."""
        items = payload if isinstance(payload, list) else [payload]
        rules = [FaultRule.from_json(item) for item in items]
        self.rules.extend(rules)
        return rules

    def clear(self) -> None:
        self.rules.clear()

    def snapshot(self) -> list[dict[str, Any]]:
        return [rule.to_json() for rule in self.rules]

    def match(self, method: str, path: str) -> Matched:
        matched = Matched()
        for rule in self.rules:
            if not rule.offer(method, path):
                continue
            if rule.kind == "job":
                matched.job.append(rule)
            elif matched.transport is None:
                matched.transport = rule
        return matched
