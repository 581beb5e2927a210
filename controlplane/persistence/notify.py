"""PostgreSQL ``LISTEN``/``NOTIFY`` on one dedicated connection (the wake-ups' broker-less path).

`controlplane.wakeups.PgNotifyWakeBus` decides what a notification means; this module only
speaks to PostgreSQL. The connection is the driver's own (asyncpg), outside any pool, because
a listener lives as long as its session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["NotifyChannel"]


class NotifyChannel:
    """``LISTEN channel`` with a callback, and ``pg_notify(channel, payload)``."""

    def __init__(self, database_url: str, channel: str) -> None:
        # SQLAlchemy's "postgresql+asyncpg://" -> the driver's own DSN.
        self._dsn = "postgresql://" + database_url.split("://", 1)[1]
        self.channel = channel
        self._conn: Any = None

    @property
    def open(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def listen(self, on_payload: Callable[[str], None], timeout_s: float) -> None:
        """Open the session and listen; raises what the driver raises when it cannot."""
        import asyncpg  # type: ignore[import-untyped]  # the store's own PostgreSQL driver

        await self.close()
        conn = await asyncpg.connect(self._dsn, timeout=timeout_s)
        try:
            await conn.add_listener(self.channel, lambda _c, _p, _ch, payload: on_payload(payload))
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def notify(self, payload: str) -> None:
        await self._conn.execute("SELECT pg_notify($1, $2)", self.channel, payload)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:
                conn.terminate()
