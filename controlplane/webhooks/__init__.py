"""Caller webhooks (issue 13): configuration and the delivery worker.

The subscription rules, message bodies, retry schedule and SSRF checks are pure
(`controlplane.domain.webhooks`); the outbox rows are `controlplane.persistence.webhooks`.
"""
