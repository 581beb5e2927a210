"""Caller-webhook rules (controlplane.domain.webhooks): subscriptions, event types, retry
schedule, verdicts and the SSRF address check, without any I/O."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.webhooks import (
    DeliveryState,
    RetryPolicy,
    WebhookSubscription,
    address_refusal,
    event_type_for,
    events_from_mask,
    message_body,
    outputs_of,
    subscription_violations,
    verdict,
)


def test_a_valid_https_subscription_has_no_violation() -> None:
    """An https URL with known event types is accepted as it is."""
    assert not subscription_violations(
        "https://hooks.example.com/in?x=1", ["task.progress", "task.succeeded"], allow_http=False
    )


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("", "is required"),
        ("http://hooks.example.com/", "scheme must be https"),
        ("ftp://hooks.example.com/", "scheme must be https"),
        ("https:///path", "must name a host"),
        ("https://user:pw@hooks.example.com/", "credentials"),
        ("https://hooks.example.com:99999/", "not a valid URL"),
        ("https://hooks.example.com/a b", "without spaces"),
        ("https://hooks.example.com/#frag", "fragment"),
    ],
)
def test_a_bad_url_is_a_violation_of_webhook_url(url: str, fragment: str) -> None:
    """Each malformed URL is reported on `webhook.url` with a sentence saying what is wrong."""
    found = subscription_violations(url, [], allow_http=False)
    assert [v.field for v in found] == ["webhook.url"]
    assert fragment in found[0].description


def test_http_is_accepted_only_where_configuration_allows_it() -> None:
    """Plain http is refused by default and accepted with allow_http."""
    assert subscription_violations("http://h.example/", [], allow_http=False)
    assert not subscription_violations("http://h.example/", [], allow_http=True)


def test_each_unknown_event_is_reported_at_its_index() -> None:
    """An event type outside the closed list is a violation of `webhook.events[i]`."""
    found = subscription_violations(
        "https://h.example/", ["task.progress", "task.exploded", "nope"], allow_http=False
    )
    assert [v.field for v in found] == ["webhook.events[1]", "webhook.events[2]"]


def test_the_subscription_mask_round_trips_the_optional_events() -> None:
    """Optional events survive the column's bit mask; terminal ones are implied, not stored."""
    sub = WebhookSubscription("https://h.example/", ("task.state_changed", "task.succeeded"))
    assert events_from_mask(sub.mask) == ("task.state_changed",)
    both = WebhookSubscription("https://h.example/", ("task.progress", "task.state_changed"))
    assert WebhookSubscription.stored(both.url, both.mask) == both


@pytest.mark.parametrize(
    ("kind", "state", "expected"),
    [
        ("task.state_changed", "SUCCEEDED", "task.succeeded"),
        ("task.state_changed", "FAILED", "task.failed"),
        ("task.state_changed", "CANCELLED", "task.cancelled"),
        ("task.state_changed", "RUNNING", "task.state_changed"),
        ("provider.progress", "", "task.progress"),
        ("attempt.state_changed", "RUNNING", None),
        ("task.queued", "QUEUED", None),
    ],
)
def test_task_events_map_to_webhook_event_types(kind: str, state: str, expected: str) -> None:
    """Terminal changes are their terminal type, other changes state_changed, progress progress."""
    assert event_type_for(kind, {"state": state}) == expected


def test_the_body_carries_type_time_and_the_task_data() -> None:
    """The body is compact JSON with the type, the event time and the task's state and outputs."""
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    failure = {"class": "PROVIDER", "code": "X", "message": "m"}
    body = json.loads(
        message_body(
            "task.failed",
            at,
            7,
            {"state": "FAILED", "status_version": 3, "failure": failure},
            [{"uri": "s3://b/k"}],
        )
    )
    assert body == {
        "type": "task.failed",
        "timestamp": at.isoformat(),
        "data": {
            "task_id": "7",
            "state": "FAILED",
            "status_version": 3,
            "failure": failure,
            "outputs": [{"uri": "s3://b/k"}],
        },
    }
    reading = {"attempt_id": 3, "state": "RUNNING", "fraction": 0.5}
    progress = json.loads(message_body("task.progress", at, 7, reading))
    assert progress["data"] == {"task_id": "7", "attempt_id": "3", "progress": {"fraction": 0.5}}


def test_outputs_of_lists_every_sample() -> None:
    """A multi-sample output asset gives each sample; a single-object one gives itself."""
    assert outputs_of({"samples": [{"uri": "a"}, {"uri": "b"}]}) == [{"uri": "a"}, {"uri": "b"}]
    assert outputs_of({"uri": "a"}) == [{"uri": "a"}]
    assert outputs_of(None) == []


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_retry_delays_grow_and_stay_within_their_jitter_bounds(seed: int) -> None:
    """Every delay is in the upper half of its ceiling, and each is at least the one before."""
    policy = RetryPolicy()
    rng = random.Random(seed)
    delays = [policy.delay_s(n, rng) for n in range(1, policy.max_attempts)]
    for n, delay in enumerate(delays, start=1):
        assert policy.ceiling(n) / 2 <= delay <= policy.ceiling(n)
    growing = delays[:5]  # below the 12 h cap, where the multiplier is the whole story
    assert growing == sorted(growing)


def test_the_default_schedule_spans_about_a_day() -> None:
    """Eight attempts at scale 1 span between 12 and 26 hours whatever the jitter draws."""
    policy = RetryPolicy()
    ceilings = [policy.ceiling(n) for n in range(1, policy.max_attempts)]
    assert sum(ceilings) / 2 >= 12 * 3600
    assert sum(ceilings) <= 26 * 3600


@pytest.mark.parametrize(
    ("status", "attempts", "state"),
    [
        (200, 1, DeliveryState.DELIVERED),
        (204, 8, DeliveryState.DELIVERED),
        (410, 1, DeliveryState.FAILED),
        (500, 1, DeliveryState.PENDING),
        (0, 7, DeliveryState.PENDING),
        (500, 8, DeliveryState.FAILED),
        (302, 1, DeliveryState.PENDING),
    ],
)
def test_verdicts(status: int, attempts: int, state: DeliveryState) -> None:
    """2xx delivers, 410 stops, other answers retry until the last attempt, then fail."""
    judged = verdict(status, attempts, RetryPolicy())
    assert judged.state is state
    assert judged.retry is (state is DeliveryState.PENDING)


@pytest.mark.parametrize(
    ("address", "label"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("172.16.5.4", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "not globally routable"),
        ("::ffff:127.0.0.1", "loopback"),
    ],
)
def test_private_and_special_addresses_are_refused_by_default(address: str, label: str) -> None:
    """Loopback, private, link-local, multicast and other non-global addresses are refused."""
    assert label in address_refusal(address)


def test_public_addresses_pass_and_configuration_can_allow_private_ones() -> None:
    """A global address passes; allow_private or an allowlisted network lets a private one."""
    import ipaddress

    assert address_refusal("93.184.216.34") == ""
    assert address_refusal("2606:4700::1111") == ""
    assert address_refusal("127.0.0.1", allow_private=True) == ""
    allowed = [ipaddress.ip_network("10.1.0.0/16")]
    assert address_refusal("10.1.2.3", allowed=allowed) == ""
    assert address_refusal("10.2.0.1", allowed=allowed) != ""


@pytest.mark.parametrize(
    ("address", "label"),
    [
        ("64:ff9b::7f00:1", "(reaching 127.0.0.1) is a loopback"),  # NAT64 of loopback
        ("64:ff9b::a00:5", "(reaching 10.0.0.5) is a private"),  # NAT64 of RFC 1918
        ("2002:7f00:1::1", "(reaching 127.0.0.1) is a loopback"),  # 6to4 of loopback
        ("2002:a9fe:a9fe::1", "(reaching 169.254.169.254) is a link-local"),  # 6to4 metadata
        ("fec0::1", "is a site-local"),
        ("::ffff:10.0.0.1", "(reaching 10.0.0.1) is a private"),
    ],
)
def test_ipv6_forms_of_private_addresses_are_refused(address: str, label: str) -> None:
    """An IPv6 address that reaches a private IPv4 one (NAT64, 6to4, mapped) is refused by the
    address it reaches, and deprecated site-local fec0::/10 is refused like private space."""
    assert label in address_refusal(address)


def test_public_addresses_behind_nat64_and_6to4_pass() -> None:
    """The same IPv6 forms of a public IPv4 address are allowed (an IPv6-only network with
    DNS64 reaches every IPv4 receiver so)."""
    assert address_refusal("64:ff9b::808:808") == ""
    assert address_refusal("2002:808:808::1") == ""
    assert address_refusal("::ffff:8.8.8.8") == ""
