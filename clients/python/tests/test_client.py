"""levee_client against a real node (LEVEE_URL), started by tests/python.rs. The node runs
`search-per-tenant` (1,000 a minute) and `tiny` (2 a minute)."""

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from levee_client import (
    AsyncClient,
    Check,
    Client,
    LeveeApiError,
    LeveeUnavailable,
)


def test_check_answers_the_figures_and_the_headers(url: str, key: str) -> None:
    with Client(url) as levee:
        d = levee.check("search-per-tenant", key)
    assert (d.allowed, d.limit, d.remaining, d.fallback) == (True, 1000, 999, False)
    assert d.headers["x-ratelimit-remaining"] == "999"
    assert d.headers["ratelimit-policy"] == '"search-per-tenant";q=1000;w=60'


def test_a_denied_check_says_when_to_retry(url: str, key: str) -> None:
    with Client(url) as levee:
        assert [levee.check("tiny", key).allowed for _ in range(3)] == [True, True, False]
        d = levee.check("tiny", key)
    assert d.retry_after_ms > 0 and d.remaining == 0
    assert int(d.headers["retry-after"]) >= 1


def test_bad_requests_raise_the_nodes_error(url: str) -> None:
    with Client(url) as levee:
        with pytest.raises(LeveeApiError) as e:
            levee.check("no-such-rule", "acme")
        assert (e.value.status, e.value.code) == (404, "unknown_rule")
        with pytest.raises(LeveeApiError) as e:
            levee.check("tiny", "")
        assert (e.value.status, e.value.code) == (400, "invalid_request")
        assert "key" in e.value.message


def test_an_idempotency_key_given_is_charged_once(url: str, key: str) -> None:
    with Client(url) as levee:
        first = levee.check("tiny", key, idempotency_key="order-1")
        again = levee.check("tiny", key, idempotency_key="order-1")
        assert first.remaining == again.remaining == 1
        assert levee.usage("tiny", key).used == 1


def test_batch_all_refund_and_usage(url: str, key: str) -> None:
    with Client(url) as levee:
        out = levee.batch([Check("tiny", key), Check("tiny", key), Check("tiny", key)])
        assert [d.allowed for d in out] == [True, True, False]
        u = levee.usage("tiny", key)
        assert (u.used, u.remaining, u.limit) == (2, 0, 2)
        other = key + "-b"
        d = levee.check_all([Check("tiny", key), Check("search-per-tenant", other)])
        assert not d.allowed and d.results is not None and len(d.results) == 2
        # Nothing consumed by a denied `all`.
        assert levee.usage("search-per-tenant", other).used == 0
        r = levee.refund("tiny", key)
        assert r.remaining == 1
        assert levee.check("tiny", key).allowed


def test_the_async_client(url: str, key: str) -> None:
    async def run() -> None:
        async with AsyncClient(url) as levee:
            ds = await asyncio.gather(*(levee.check("tiny", key) for _ in range(3)))
            assert sorted(d.allowed for d in ds) == [False, True, True]
            u = await levee.usage("tiny", key)
            assert u.used == 2
            r = await levee.refund("tiny", key, 2)
            assert r.remaining == 2
            b = await levee.batch([Check("tiny", key, 2)])
            assert b[0].allowed and b[0].remaining == 0
            with pytest.raises(LeveeApiError):
                await levee.check("no-such-rule", key)

    asyncio.run(run())


def _closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_with_no_node_the_fallback_decides(key: str) -> None:
    dead = _closed_port()
    with Client(dead, retries=1, fallback="open") as levee:
        d = levee.check("tiny", key)
        assert d.allowed and d.fallback and d.degraded
    with Client(dead, retries=1, fallback="closed") as levee:
        assert not levee.check("tiny", key).allowed
    with Client(dead, retries=1) as levee:
        with pytest.raises(LeveeUnavailable):
            levee.check("tiny", key)


def test_a_dead_node_first_is_retried_on_the_next(url: str, key: str) -> None:
    with Client([_closed_port(), url], retries=1) as levee:
        d = levee.check("tiny", key)
        assert d.allowed and not d.fallback
        assert levee.usage("tiny", key).used == 1


def test_the_starlette_example_limits_per_tenant(url: str, key: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from starlette.testclient import TestClient

    import starlette_app

    levee = AsyncClient(url)
    app = starlette_app.create_app(levee)
    # The example's rule is `search-per-tenant`; `tiny` is not used here.
    with TestClient(app) as http:
        r = http.get("/search", headers={"x-tenant": key})
        assert r.status_code == 200 and r.json()["tenant"] == key
        assert r.headers["x-ratelimit-remaining"] == "999"
        assert http.get("/search").status_code == 400
        # Use the tenant's minute up, then the middleware refuses.
        with Client(url) as direct:
            direct.check("search-per-tenant", key, 999)
        r = http.get("/search", headers={"x-tenant": key})
        assert r.status_code == 429 and r.json()["error"] == "rate_limited"
        assert int(r.headers["retry-after"]) >= 1


def test_an_all_call_with_no_node_falls_back_with_every_entry(key: str) -> None:
    with Client(_closed_port(), retries=0, fallback="closed") as levee:
        d = levee.check_all([Check("tiny", key), Check("search-per-tenant", key)])
        assert not d.allowed and d.fallback
        assert d.results is not None and [r.rule for r in d.results] == ["tiny", "search-per-tenant"]


def test_overrides_put_get_list_delete_and_their_effect(url: str, key: str) -> None:
    with Client(url) as levee:
        o = levee.put_override("tiny", key, limit=4, ttl="1h")
        assert (o.rule, o.key, o.limit, o.action) == ("tiny", key, 4, None)
        assert o.expires_in_ms is not None and 3_500_000 < o.expires_in_ms <= 3_600_000
        decisions = [levee.check("tiny", key) for _ in range(5)]
        assert [d.allowed for d in decisions] == [True] * 4 + [False]
        assert decisions[0].limit == 4
        got = levee.get_override("tiny", key)
        assert got is not None and got.limit == 4
        assert key in [x.key for x in levee.list_overrides("tiny")]
        levee.delete_override("tiny", key)
        assert levee.get_override("tiny", key) is None
        assert levee.check("tiny", key).limit == 2
        banned = key + "-banned"
        levee.put_override("tiny", banned, action="deny")
        d = levee.check("tiny", banned)
        assert (d.allowed, d.list, d.retry_after_ms) == (False, "deny", 0)
        with pytest.raises(LeveeApiError) as e:
            levee.put_override("tiny", key, rate=3)
        assert (e.value.status, e.value.code) == (400, "invalid_request")
        assert e.value.message.startswith("rate")
        with pytest.raises(LeveeApiError) as e:
            levee.list_overrides("no-such-rule")
        assert (e.value.status, e.value.code) == (404, "unknown_rule")
        levee.delete_override("tiny", banned)


def test_overrides_async(url: str, key: str) -> None:
    async def go() -> None:
        async with AsyncClient(url) as levee:
            o = await levee.put_override("tiny", key, action="allow")
            assert o.action == "allow"
            ds = [await levee.check("tiny", key) for _ in range(5)]
            assert all(d.allowed and d.list == "allow" for d in ds)
            assert (await levee.usage("tiny", key)).used == 0
            listed = await levee.list_overrides("tiny")
            assert [x.action for x in listed if x.key == key] == ["allow"]
            await levee.delete_override("tiny", key)
            assert await levee.get_override("tiny", key) is None

    asyncio.run(go())


def test_max_wait_ms_is_sent_and_waited_ms_read(url: str, key: str) -> None:
    # A single node holds the whole limit: it never waits, and says so.
    with Client(url) as levee:
        d = levee.check("tiny", key, max_wait_ms=2_000)
        assert (d.allowed, d.waited_ms) == (True, 0)
        assert levee.check("tiny", key).waited_ms is None
        [a, b] = levee.batch([Check("search-per-tenant", key, max_wait_ms=100),
                              Check("search-per-tenant", key)])
        assert (a.allowed, a.waited_ms, b.waited_ms) == (True, 0, None)
        with pytest.raises(LeveeApiError) as e:
            levee.check("tiny", key, max_wait_ms=10_001)
        assert (e.value.status, e.value.code) == (400, "invalid_request")
        assert "max_wait_ms" in e.value.message

    async def run() -> None:
        async with AsyncClient(url) as levee:
            d = await levee.check("search-per-tenant", key, max_wait_ms=500)
            assert (d.allowed, d.waited_ms) == (True, 0)

    asyncio.run(run())
