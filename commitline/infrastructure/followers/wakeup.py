"""Waking followers when events are appended: PostgreSQL LISTEN, with polling as the fallback.

Writers send NOTIFY after each commit. A follower waits for one, or for the poll interval
to pass, whichever comes first; if the listening connection breaks it reconnects on the
next wait, and until then the poll interval alone paces it. A lost wake-up only delays. A broken
LISTEN is logged once as it breaks and once as it listens again, however many reconnections fail between.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.store.datastore import connect_options

log = logging.getLogger(__name__)


class LogWakeup:
    def __init__(self, conninfo: dict[str, Any], channel: str):
        self.conninfo = conninfo
        self.channel = channel
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._broken = False

    async def wait(self, timeout: float) -> bool:
        """True if a NOTIFY arrived within ``timeout`` seconds, False if the interval passed."""
        try:
            conn = await self._listening()
            async for _ in conn.notifies(timeout=timeout, stop_after=1):
                return True
            return False
        except (psycopg.Error, OSError) as e:
            if not self._broken:
                log.warning("LISTEN %s failed (%s); polling until it reconnects", self.channel, type(e).__name__)
                self._broken = True
            await self.close()
            await asyncio.sleep(timeout)
            return False

    async def _listening(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(**connect_options(self.conninfo, connect_timeout=10),
                                                               autocommit=True)
            await self._conn.execute(SQL("LISTEN {}").format(Identifier(self.channel)))
            if self._broken:
                log.info("LISTEN %s reconnected", self.channel)
                self._broken = False
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except psycopg.Error:
                pass


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
