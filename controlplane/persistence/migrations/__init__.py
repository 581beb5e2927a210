"""Alembic environment and revisions; run them through `controlplane.persistence.migrate`."""
