"""Fenced writes to PostgreSQL (docs/fencing.md): a write for unit `u` under fencing token `t`
commits only if no write for `u` under a higher token has been accepted. A worker that lost
`u` (paused, cut off from the API server, or force-deleted) keeps its old token, the new owner
writes under a higher one, and from the new owner's first write on every write of the old one
is refused by the database itself.

    fence = Fence(conn, scope="PartitionSet/shop/orders/<set uid>")
    fence.ensure_schema()
    with fence.write(unit, worker.token(unit)) as cur:   # StaleToken: the unit moved on
        cur.execute("UPDATE orders SET ... WHERE partition = %s", (unit,))

`write` opens a transaction whose first statement is one atomic upsert of the unit's row in
`apportion_fence`, raising the token only if it does not go down. Accepted, it leaves the row
locked until the transaction ends, so the caller's statements in the block commit together with
the token and every competing writer of the unit waits: no read-modify-write race. Refused,
nothing of the block runs and nothing commits.

Tokens are comparable within one set incarnation only (a recreated set starts its epochs over):
put the set's uid in the scope. Sits on the standard library and psycopg 3 (the `postgres`
extra), so any process holding tokens may use it, with or without the worker library.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import psycopg
from psycopg.pq import TransactionStatus

SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS apportion_fence (scope text NOT NULL, unit text NOT NULL,"
    " token bigint NOT NULL, PRIMARY KEY (scope, unit))"
)
SCHEMA_LOCK: Final = "SELECT pg_advisory_xact_lock(107135550583412)"
"""Serializes `ensure_schema` across processes: two concurrent CREATE TABLE IF NOT EXISTS of one
table can both miss it and one then fails on the catalog's unique index (seen with 8 workers
starting at once). The key is "apport" in ASCII; the Java client takes the same lock."""
ADVANCE: Final = (
    "INSERT INTO apportion_fence (scope, unit, token) VALUES (%s, %s, %s)"
    " ON CONFLICT (scope, unit) DO UPDATE SET token = EXCLUDED.token"
    " WHERE apportion_fence.token <= EXCLUDED.token RETURNING token"
)
CURRENT: Final = "SELECT token FROM apportion_fence WHERE scope = %s AND unit = %s"


class StaleToken(Exception):
    """A write for `unit` under a higher token than `token` was accepted: another owner has the
    unit now. Nothing of the refused write was committed. `current` is the highest token
    accepted, read right after the refusal (None only if someone deleted the row meanwhile;
    apportion never deletes one)."""

    def __init__(self, unit: str, token: int, current: int | None) -> None:
        super().__init__(f"unit {unit!r}: token {token} is stale, {current} was accepted")
        self.unit = unit
        self.token = token
        self.current = current


def _check(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], token: int) -> None:
    # bool is an int, and None is what Worker.token returns for a unit not held: neither is a
    # token, and NULL would never compare as higher.
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"a fencing token is an int, not {token!r}")
    # An open transaction would make ours a savepoint of it: statements run before the fence
    # would commit with it, unfenced, and nothing would commit at the end of the block.
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(
            "fenced write on a connection inside a transaction: commit or roll back first"
        )


class Fence:
    """Fenced writes on `conn` for the units of `scope` (any text naming one token space, e.g.
    "PartitionSet/shop/orders/<set uid>"; several sets share the table under their own
    scopes). Like its connection, a Fence serves one thread at a time."""

    def __init__(self, conn: psycopg.Connection[Any], scope: str) -> None:
        self.conn = conn
        self.scope = scope

    def ensure_schema(self) -> None:
        """Create `apportion_fence` if missing; safe from many processes at once."""
        with self.conn.transaction():
            self.conn.execute(SCHEMA_LOCK)
            self.conn.execute(SCHEMA)

    @contextmanager
    def write(self, unit: str, token: int) -> Iterator[psycopg.Cursor[Any]]:
        """A transaction on the connection for a write to `unit` under `token`, yielding a
        cursor in it: raises `StaleToken` before the block runs when a higher token was
        accepted, commits the token with the block's statements when the block returns, rolls
        both back when it raises."""
        _check(self.conn, token)
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute(ADVANCE, (self.scope, unit, token))
            if cur.fetchone() is None:
                cur.execute(CURRENT, (self.scope, unit))
                row = cur.fetchone()
                raise StaleToken(unit, token, row[0] if row else None)
            yield cur


class AsyncFence:
    """`Fence` on a psycopg `AsyncConnection`: `await ensure_schema()`,
    `async with fence.write(unit, token) as cur`."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], scope: str) -> None:
        self.conn = conn
        self.scope = scope

    async def ensure_schema(self) -> None:
        async with self.conn.transaction():
            await self.conn.execute(SCHEMA_LOCK)
            await self.conn.execute(SCHEMA)

    @asynccontextmanager
    async def write(self, unit: str, token: int) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
        _check(self.conn, token)
        async with self.conn.transaction(), self.conn.cursor() as cur:
            await cur.execute(ADVANCE, (self.scope, unit, token))
            if await cur.fetchone() is None:
                await cur.execute(CURRENT, (self.scope, unit))
                row = await cur.fetchone()
                raise StaleToken(unit, token, row[0] if row else None)
            yield cur
