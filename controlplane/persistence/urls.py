"""What the composition root needs to know about a database URL, without speaking SQL itself."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url


def sqlite_file(database_url: str) -> Path | None:
    """The file of an SQLite URL; None for another backend or an in-memory database."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    if url.database.startswith("file:") or url.query.get("mode") == "memory":
        return None
    return Path(url.database).resolve()


def display_url(database_url: str) -> str:
    """The URL as a log line may show it: the password hidden."""
    return make_url(database_url).render_as_string(hide_password=True)
