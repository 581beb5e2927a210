"""Alembic revisions (package so setuptools ships them)."""
