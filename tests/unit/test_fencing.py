"""`apportion.fencing` against a real PostgreSQL server (tests/support/postgres.py): the shared
cases of conformance/fencing (the Java client's `PostgresFenceTest` plays the same files),
competing writers on many connections judged by the commit order the database records, a
hypothesis property against an in-memory model, and the guards of the API."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.fencing import AsyncFence, Fence, StaleToken
from tests.support.postgres import PostgresServer

CASES = sorted((Path(__file__).resolve().parents[2] / "conformance" / "fencing").glob("*.json"))

DATA = "CREATE TABLE fencing_data (scope text, unit text, value text, PRIMARY KEY (scope, unit))"
UPSERT = (
    "INSERT INTO fencing_data (scope, unit, value) VALUES (%s, %s, %s)"
    " ON CONFLICT (scope, unit) DO UPDATE SET value = EXCLUDED.value"
)
FAIL = "SELECT 1 / 0"
"""The application's statement that fails after the fence accepted (conformance `fail`)."""


def contents(conn: psycopg.Connection[Any], query: str) -> dict[str, dict[str, Any]]:
    """scope -> unit -> value of a (scope, unit, value) query, read outside any fence."""
    out: dict[str, dict[str, Any]] = {}
    for scope, unit, value in conn.execute(query).fetchall():
        out.setdefault(scope, {})[unit] = value
    conn.commit()
    return out


def expected(step: dict[str, Any]) -> tuple[str, int | None]:
    return step["expect"], step.get("current")


# ------------------------------------------------------------------------ conformance cases


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_conformance_case(postgres: PostgresServer, path: Path) -> None:
    case = json.loads(path.read_text())
    with psycopg.connect(postgres.create_database("conformance")) as conn:
        conn.execute(DATA)
        conn.commit()
        Fence(conn, "").ensure_schema()
        for i, step in enumerate(case["writes"]):
            fence = Fence(conn, step["scope"])
            try:
                with fence.write(step["unit"], step["token"]) as cur:
                    cur.execute(UPSERT, (step["scope"], step["unit"], step["value"]))
                    if step.get("fail"):
                        cur.execute(FAIL)
                outcome: tuple[str, int | None] = ("accepted", None)
            except StaleToken as refused:
                outcome = ("stale", refused.current)
            except psycopg.errors.DivisionByZero:
                outcome = ("failed", None)
            assert outcome == expected(step), f"write {i}: {step}"
        assert contents(conn, "SELECT scope, unit, token FROM apportion_fence") == case["fence"]
        assert contents(conn, "SELECT scope, unit, value FROM fencing_data") == case["data"]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
async def test_conformance_case_async(postgres: PostgresServer, path: Path) -> None:
    case = json.loads(await asyncio.to_thread(path.read_text))
    dsn = postgres.create_database("conformance")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(DATA)
        await conn.commit()
        await AsyncFence(conn, "").ensure_schema()
        for i, step in enumerate(case["writes"]):
            fence = AsyncFence(conn, step["scope"])
            try:
                async with fence.write(step["unit"], step["token"]) as cur:
                    await cur.execute(UPSERT, (step["scope"], step["unit"], step["value"]))
                    if step.get("fail"):
                        await cur.execute(FAIL)
                outcome: tuple[str, int | None] = ("accepted", None)
            except StaleToken as refused:
                outcome = ("stale", refused.current)
            except psycopg.errors.DivisionByZero:
                outcome = ("failed", None)
            assert outcome == expected(step), f"write {i}: {step}"
    with psycopg.connect(dsn) as check:
        assert contents(check, "SELECT scope, unit, token FROM apportion_fence") == case["fence"]
        assert contents(check, "SELECT scope, unit, value FROM fencing_data") == case["data"]


def test_the_cases_cover_every_outcome() -> None:
    outcomes = {step["expect"] for path in CASES for step in json.loads(path.read_text())["writes"]}
    assert outcomes == {"accepted", "stale", "failed"}


# ------------------------------------------------------------------------ competing writers


COMMIT_ORDER = """
CREATE TABLE commit_order (n bigint NOT NULL);
INSERT INTO commit_order VALUES (0);
CREATE TABLE accepted (seq bigint PRIMARY KEY, unit text NOT NULL, token bigint NOT NULL);
"""
RECORD = (
    "WITH next AS (UPDATE commit_order SET n = n + 1 RETURNING n)"
    " INSERT INTO accepted (seq, unit, token) SELECT n, %s, %s FROM next"
)
"""The last statement of every accepted write: its number in commit order. A sequence would not
do (nextval is taken when the statement runs, not at commit, so it shows commit order only if
the fence serializes the writers, which is what is under test); the counter's row stays locked
from the increment to the commit, so the numbers follow the commits whatever the fence does."""


class FenceLike(Protocol):
    def write(self, unit: str, token: int) -> AbstractContextManager[psycopg.Cursor[Any]]: ...


@dataclass
class History:
    """What the writers saw: (unit, token) of each write they saw commit, and (unit, token,
    current, last seq committed when the refusal was seen) of each refusal."""

    accepted: list[tuple[str, int]] = field(default_factory=list)
    refused: list[tuple[str, int, int | None, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def write(
    fence: FenceLike, conn: psycopg.Connection[Any], unit: str, token: int, history: History
) -> None:
    try:
        with fence.write(unit, token) as cur:
            time.sleep(random.random() / 1000)  # hold the unit a while: writers queue up
            cur.execute(RECORD, (unit, token))
    except StaleToken as refused:
        row = conn.execute("SELECT n FROM commit_order").fetchone()
        conn.commit()
        assert row is not None
        with history.lock:
            history.refused.append((unit, token, refused.current, row[0]))
    else:
        with history.lock:
            history.accepted.append((unit, token))


def check(conn: psycopg.Connection[Any], scope: str, history: History) -> None:
    """The oracle: the database's own record of what committed, in commit order."""
    rows = conn.execute("SELECT seq, unit, token FROM accepted ORDER BY seq").fetchall()
    fence = dict(conn.execute("SELECT unit, token FROM apportion_fence WHERE scope = %s", (scope,)))
    conn.commit()
    assert sorted((unit, token) for _, unit, token in rows) == sorted(history.accepted)
    for unit in {unit for _, unit, _ in rows}:
        tokens = [token for _, u, token in rows if u == unit]
        assert tokens == sorted(tokens), f"unit {unit}: tokens in commit order {tokens}"
        assert fence[unit] == tokens[-1]
    for unit, token, current, seen in history.refused:
        assert current is not None
        assert token < current
        assert (unit, current) in history.accepted
        assert any(u == unit and t > token and seq <= seen for seq, u, t in rows), (
            f"unit {unit}: token {token} refused before any higher token committed"
        )


@pytest.fixture
def race_dsn(postgres: PostgresServer) -> str:
    dsn = postgres.create_database("race")
    with psycopg.connect(dsn) as conn:
        conn.execute(COMMIT_ORDER)
        Fence(conn, "").ensure_schema()
    return dsn


def test_competing_writers_commit_in_token_order(race_dsn: str) -> None:
    """8 connections write random tokens to 3 units at once; every accepted write's tokens per
    unit rise in commit order, and every refusal had a higher token committed before it."""
    scope, history = "race", History()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with psycopg.connect(race_dsn) as conn:
            fence = Fence(conn, scope)
            for _ in range(40):
                write(fence, conn, rng.choice("abc"), rng.randint(1, 30), history)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(history.accepted) + len(history.refused) == 8 * 40
    assert len(history.accepted) > 3, "no contention"
    assert len(history.refused) > 3, "no contention"
    with psycopg.connect(race_dsn) as conn:
        check(conn, scope, history)


class ReadModifyWriteFence:
    """What the fence must not be: read the token, compare, then write. Both writers read
    before either writes (`read`), and the one given `turn` writes only after the other did
    (`wrote`): both pass, and the later commit wins whatever its token."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        scope: str,
        read: threading.Barrier,
        turn: threading.Event | None = None,
        wrote: threading.Event | None = None,
    ) -> None:
        self.conn, self.scope, self.read, self.turn, self.wrote = conn, scope, read, turn, wrote

    @contextmanager
    def write(self, unit: str, token: int) -> Iterator[psycopg.Cursor[Any]]:
        with self.conn.transaction(), self.conn.cursor() as cur:
            row = cur.execute(
                "SELECT token FROM apportion_fence WHERE scope = %s AND unit = %s",
                (self.scope, unit),
            ).fetchone()
            self.read.wait()
            if self.turn is not None:
                self.turn.wait()
            if row is not None and row[0] > token:
                raise StaleToken(unit, token, row[0])
            cur.execute(
                "INSERT INTO apportion_fence VALUES (%s, %s, %s)"
                " ON CONFLICT (scope, unit) DO UPDATE SET token = EXCLUDED.token",
                (self.scope, unit, token),
            )
            if self.wrote is not None:
                self.wrote.set()
            yield cur


def test_the_order_check_catches_a_read_modify_write_race(race_dsn: str) -> None:
    """The oracle must be able to fail: token 3 read the table before token 5 was written, and
    its write, queued behind 5's, commits after it."""
    scope, history, read, wrote = "race", History(), threading.Barrier(2), threading.Event()

    def writer(token: int) -> None:
        with psycopg.connect(race_dsn) as conn:
            turn = wrote if token == 3 else None
            fence = ReadModifyWriteFence(conn, scope, read, turn, wrote if token == 5 else None)
            write(fence, conn, "a", token, history)

    threads = [threading.Thread(target=writer, args=(token,)) for token in (5, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(history.accepted) == [("a", 3), ("a", 5)]
    with psycopg.connect(race_dsn) as conn, pytest.raises(AssertionError, match="commit order"):
        check(conn, scope, history)


def test_a_writer_waits_for_the_unit_until_the_holder_commits(race_dsn: str) -> None:
    """The accepted token's row stays locked until commit: a competing writer neither reads a
    token that may yet roll back nor passes it; it goes on once the holder is done."""
    history = History()
    with psycopg.connect(race_dsn) as holder_conn, psycopg.connect(race_dsn) as other_conn:
        holder, other = Fence(holder_conn, "wait"), Fence(other_conn, "wait")
        done: list[str] = []

        def seven() -> None:
            write(other, other_conn, "a", 7, history)
            done.append("7")

        with holder.write("a", 5) as cur:
            cur.execute(RECORD, ("a", 5))
            higher = threading.Thread(target=seven)
            higher.start()
            higher.join(0.5)
            assert not done, "the competing writer went past a held unit"
        higher.join(10)
        assert done == ["7"]
        with pytest.raises(StaleToken) as refused, holder.write("a", 5):
            pytest.fail("the block of a refused write ran")
        assert (refused.value.unit, refused.value.token, refused.value.current) == ("a", 5, 7)
        rows = holder_conn.execute("SELECT unit, token FROM accepted ORDER BY seq").fetchall()
        assert rows == [("a", 5), ("a", 7)]


# --------------------------------------------------------------------- property vs a model


@pytest.fixture(scope="module")
def model_conn(postgres: PostgresServer) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres.create_database("model")) as conn:
        conn.execute(DATA)
        conn.commit()
        Fence(conn, "").ensure_schema()
        yield conn


WRITES = st.lists(
    st.tuples(
        st.sampled_from(["x", "y"]),  # scope
        st.sampled_from(["0", "1", "2"]),  # unit
        st.integers(0, 6),  # token
        st.integers(0, 9).map(lambda n: n == 0),  # the application's statements fail
    ),
    max_size=25,
)
RUNS = itertools.count()


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=WRITES)
def test_writes_follow_the_max_token_model(
    model_conn: psycopg.Connection[Any], writes: list[tuple[str, str, int, bool]]
) -> None:
    """Any sequence of writes: refused iff the token is below the highest accepted for the unit
    so far, else accepted unless the application's statements fail (then nothing is); the
    tables hold the model's tokens and the last accepted values."""
    run = next(RUNS)  # scopes of this example alone (hypothesis replays examples)
    model: dict[tuple[str, str], int] = {}
    values: dict[tuple[str, str], str] = {}
    for i, (scope_name, unit, token, fail) in enumerate(writes):
        scope = f"{run}/{scope_name}"
        highest = model.get((scope, unit))
        if highest is not None and token < highest:
            want: tuple[str, int | None] = ("stale", highest)
        elif fail:
            want = ("failed", None)
        else:
            want = ("accepted", None)
            model[(scope, unit)], values[(scope, unit)] = token, str(i)
        try:
            with Fence(model_conn, scope).write(unit, token) as cur:
                cur.execute(UPSERT, (scope, unit, str(i)))
                if fail:
                    cur.execute(FAIL)
            got: tuple[str, int | None] = ("accepted", None)
        except StaleToken as refused:
            got = ("stale", refused.current)
        except psycopg.errors.DivisionByZero:
            got = ("failed", None)
        assert got == want, f"write {i}"
    mine = f"{run}/%"
    tokens = model_conn.execute(
        "SELECT scope, unit, token FROM apportion_fence WHERE scope LIKE %s", (mine,)
    ).fetchall()
    data = model_conn.execute(
        "SELECT scope, unit, value FROM fencing_data WHERE scope LIKE %s", (mine,)
    ).fetchall()
    model_conn.commit()
    assert {(s, u): t for s, u, t in tokens} == model
    assert {(s, u): v for s, u, v in data} == values


# --------------------------------------------------------------------------------- guards


def test_ensure_schema_from_many_connections_at_once(postgres: PostgresServer) -> None:
    """Every worker of a fleet may call it at start: none fails on the creation race."""
    dsn = postgres.create_database("schema")
    start, errors = threading.Barrier(8), []

    def create() -> None:
        with psycopg.connect(dsn) as conn:
            start.wait()
            try:
                Fence(conn, "s").ensure_schema()
            except psycopg.Error as error:
                errors.append(error)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with psycopg.connect(dsn) as conn:
        Fence(conn, "s").ensure_schema()  # and again, on the existing table
        with Fence(conn, "s").write("0", 1):
            pass


def test_a_write_refuses_an_open_transaction_and_a_missing_token(race_dsn: str) -> None:
    with psycopg.connect(race_dsn) as conn:
        fence = Fence(conn, "guards")
        conn.execute("SELECT 1")  # psycopg opened a transaction: the fence would nest in it
        with (
            pytest.raises(psycopg.ProgrammingError, match="inside a transaction"),
            fence.write("0", 1),
        ):
            pytest.fail("the block ran")
        conn.rollback()
        for token in (None, True, 1.0):
            with pytest.raises(TypeError, match="fencing token"), fence.write("0", token):  # type: ignore[arg-type]
                pytest.fail("the block ran")


def test_a_write_in_autocommit_mode_is_one_transaction(race_dsn: str) -> None:
    with psycopg.connect(race_dsn, autocommit=True) as conn, psycopg.connect(race_dsn) as other:
        fence = Fence(conn, "autocommit")

        def record_then_fail() -> None:
            with fence.write("0", 2) as cur:
                cur.execute(RECORD, ("0", 2))
                cur.execute(FAIL)

        with pytest.raises(psycopg.errors.DivisionByZero):
            record_then_fail()
        assert other.execute("SELECT count(*) FROM accepted").fetchone() == (0,)
        other.commit()
        with fence.write("0", 1) as cur:
            cur.execute(RECORD, ("0", 1))
        with pytest.raises(StaleToken), fence.write("0", 0):
            pytest.fail("the block ran")
        assert other.execute("SELECT unit, token FROM accepted").fetchall() == [("0", 1)]
