"""``Client`` (blocking) and ``AsyncClient`` (asyncio) over httpx.

Every logical call gets one generated ``idempotency_key``, sent again on every retry, so a
retry whose first attempt was counted is not charged twice. Connect errors, timeouts and
``503`` are retried (``retries`` times, exponential backoff from ``backoff`` seconds), each
time on the next of the given nodes. When no node answered, ``fallback`` decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from ._types import (
    Check,
    Decision,
    Fallback,
    LeveeApiError,
    LeveeUnavailable,
    Override,
    Usage,
)

_HEADERS = (
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
)

Nodes = Union[str, Sequence[str]]


def _bases(nodes: Nodes) -> List[str]:
    items = [nodes] if isinstance(nodes, str) else list(nodes)
    if not items:
        raise ValueError("nodes: give at least one node URL")
    out = []
    for n in items:
        n = n.strip().rstrip("/")
        out.append(n if "://" in n else f"http://{n}")
    return out


def _key() -> str:
    return str(uuid.uuid4())


def _all_body(entries: Sequence[Check], cost: Optional[int], key: str) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "all": [
            {k: v for k, v in (("rule", c.rule), ("key", c.key), ("class", c.cls)) if v is not None}
            for c in entries
        ],
        "idempotency_key": key,
    }
    if cost is not None:
        body["cost"] = cost
    return body


def _usage_path(rule: str, key: str) -> str:
    return f"/v1/usage/{quote(rule, safe='')}/{quote(key, safe='')}"


def _override_path(rule: str, key: Optional[str] = None) -> str:
    path = f"/v1/overrides/{quote(rule, safe='')}"
    return path if key is None else f"{path}/{quote(key, safe='')}"


def _override_body(limit: Optional[int], rate: Optional[int], burst: Optional[int],
                   action: Optional[str], ttl: Optional[str]) -> Dict[str, Any]:
    pairs = (("limit", limit), ("rate", rate), ("burst", burst), ("action", action),
             ("ttl", ttl))
    return {k: v for k, v in pairs if v is not None}


def _retry_reason(base: str, resp: httpx.Response) -> Optional[str]:
    """Why to try the next node after ``resp`` (a 503), or None when it is the answer; the
    API's other errors are raised."""
    if resp.status_code == 503:
        return f"{base}: 503 unavailable"
    if resp.status_code >= 400:
        _raise_for(resp)
    return None


def _raise_for(resp: httpx.Response) -> None:
    try:
        v = resp.json()
    except ValueError:
        v = {}
    raise LeveeApiError(resp.status_code, str(v.get("error", "")), str(v.get("message", "")))


def _longest_wait(checks: Sequence[Check]) -> int:
    """The longest ``max_wait_ms`` of a batch's checks: how much longer its answer may take."""
    return max((c.max_wait_ms or 0 for c in checks), default=0)


def _decision(resp: httpx.Response) -> Decision:
    headers = {h: resp.headers[h] for h in _HEADERS if h in resp.headers}
    return Decision.from_json(resp.json(), headers)


class _Base:
    def __init__(
        self,
        nodes: Nodes,
        *,
        timeout: float = 0.5,
        retries: int = 2,
        backoff: float = 0.02,
        fallback: Fallback = "error",
        refund_token: Optional[str] = None,
        admin_token: Optional[str] = None,
    ) -> None:
        if fallback not in ("error", "open", "closed"):
            raise ValueError("fallback: one of 'error', 'open', 'closed'")
        if retries < 0:
            raise ValueError("retries: 0 or more")
        self._bases = _bases(nodes)
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._fallback: Fallback = fallback
        self._refund_token = refund_token
        self._admin_token = admin_token

    def _fall_back(self, why: str, checks: Sequence[Check]) -> List[Decision]:
        if self._fallback == "error":
            raise LeveeUnavailable(why)
        allowed = self._fallback == "open"
        return [Decision.of_fallback(c.rule, c.key, allowed) for c in checks]

    def _plan(self) -> List[Tuple[int, str]]:
        """(attempt, base) for the first attempt and each retry."""
        return [(a, self._bases[a % len(self._bases)]) for a in range(self._retries + 1)]


class Client(_Base):
    """A blocking client. ``Client("http://127.0.0.1:8750")`` or a list of nodes (tried in
    order on retries). Use as a context manager, or call ``close()``."""

    def __init__(self, nodes: Nodes, **kw: Any) -> None:
        super().__init__(nodes, **kw)
        self._http = httpx.Client(timeout=self._timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
              token: Optional[str] = None, wait_ms: int = 0) -> httpx.Response:
        last = ""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        for attempt, base in self._plan():
            if attempt:
                time.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                resp = self._http.request(method, base + path, json=body, headers=headers,
                                          timeout=self._timeout + wait_ms / 1000)
            except httpx.TransportError as e:
                last = f"{base}: {e!r}"
                continue
            why = _retry_reason(base, resp)
            if why is None:
                return resp
            last = why
        raise LeveeUnavailable(last)

    def check(self, rule: str, key: str, cost: Optional[int] = None, *,
              cls: Optional[str] = None, dry_run: bool = False,
              idempotency_key: Optional[str] = None,
              max_wait_ms: Optional[int] = None) -> Decision:
        """One decision (``POST /v1/check``); with ``max_wait_ms``, the node may wait that
        long for rights before it answers (API.md "Waiting for rights")."""
        c = Check(rule, key, cost, cls, dry_run, idempotency_key, max_wait_ms)
        try:
            return _decision(self._send("POST", "/v1/check", c.to_json(_key()),
                                        wait_ms=max_wait_ms or 0))
        except LeveeUnavailable as e:
            return self._fall_back(str(e), [c])[0]

    def check_all(self, entries: Sequence[Check], cost: Optional[int] = None) -> Decision:
        """Several limits that must all hold: nothing is consumed unless every one allows."""
        try:
            return _decision(self._send("POST", "/v1/check", _all_body(entries, cost, _key())))
        except LeveeUnavailable as e:
            results = self._fall_back(str(e), entries)
            return dataclasses.replace(results[0], results=results)

    def batch(self, checks: Sequence[Check]) -> List[Decision]:
        """Many independent decisions in one request (at most ``api.max_batch``)."""
        body = {"checks": [c.to_json(_key()) for c in checks]}
        try:
            resp = self._send("POST", "/v1/check/batch", body, wait_ms=_longest_wait(checks))
        except LeveeUnavailable as e:
            return self._fall_back(str(e), checks)
        return [Decision.from_json(r) for r in resp.json()["results"]]

    def refund(self, rule: str, key: str, cost: Optional[int] = None, *,
               cls: Optional[str] = None, idempotency_key: Optional[str] = None) -> Decision:
        """Gives tokens back; never refunded twice across retries. No fallback: raises
        ``LeveeUnavailable`` when no node answered."""
        c = Check(rule, key, cost, cls, False, idempotency_key)
        return _decision(self._send("POST", "/v1/refund", c.to_json(_key()), self._refund_token))

    def usage(self, rule: str, key: str) -> Usage:
        """The converged view of a key (``GET /v1/usage/{rule}/{key}``)."""
        return Usage.from_json(self._send("GET", _usage_path(rule, key)).json())

    def put_override(self, rule: str, key: str, *, limit: Optional[int] = None,
                     rate: Optional[int] = None, burst: Optional[int] = None,
                     action: Optional[str] = None, ttl: Optional[str] = None) -> Override:
        """Gives ``key`` its own ``limit`` (windows, quotas) or ``rate``/``burst`` (buckets),
        or puts it on a list (``action="allow"``/``"deny"``), optionally for ``ttl``
        (``"1h"``). Needs ``admin_token`` when the nodes have one."""
        body = _override_body(limit, rate, burst, action, ttl)
        resp = self._send("PUT", _override_path(rule, key), body, self._admin_token)
        return Override.from_json(resp.json())

    def get_override(self, rule: str, key: str) -> Optional[Override]:
        """The key's override, or ``None``."""
        try:
            return Override.from_json(self._send("GET", _override_path(rule, key)).json())
        except LeveeApiError as e:
            if e.status == 404 and e.code == "not_found":
                return None
            raise

    def list_overrides(self, rule: str) -> List[Override]:
        """Every override of ``rule`` in force, by key."""
        resp = self._send("GET", _override_path(rule))
        return [Override.from_json(o) for o in resp.json()["overrides"]]

    def delete_override(self, rule: str, key: str) -> None:
        """Removes the key's override: the rule's own figures apply again."""
        self._send("DELETE", _override_path(rule, key), None, self._admin_token)


class AsyncClient(_Base):
    """The asyncio twin of ``Client``: ``async with AsyncClient(url) as c: await c.check(...)``."""

    def __init__(self, nodes: Nodes, **kw: Any) -> None:
        super().__init__(nodes, **kw)
        self._http = httpx.AsyncClient(timeout=self._timeout)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                    token: Optional[str] = None, wait_ms: int = 0) -> httpx.Response:
        last = ""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        for attempt, base in self._plan():
            if attempt:
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                resp = await self._http.request(method, base + path, json=body,
                                                headers=headers,
                                                timeout=self._timeout + wait_ms / 1000)
            except httpx.TransportError as e:
                last = f"{base}: {e!r}"
                continue
            why = _retry_reason(base, resp)
            if why is None:
                return resp
            last = why
        raise LeveeUnavailable(last)

    async def check(self, rule: str, key: str, cost: Optional[int] = None, *,
                    cls: Optional[str] = None, dry_run: bool = False,
                    idempotency_key: Optional[str] = None,
                    max_wait_ms: Optional[int] = None) -> Decision:
        """One decision (``POST /v1/check``); with ``max_wait_ms``, the node may wait that
        long for rights before it answers (API.md "Waiting for rights")."""
        c = Check(rule, key, cost, cls, dry_run, idempotency_key, max_wait_ms)
        try:
            return _decision(await self._send("POST", "/v1/check", c.to_json(_key()),
                                              wait_ms=max_wait_ms or 0))
        except LeveeUnavailable as e:
            return self._fall_back(str(e), [c])[0]

    async def check_all(self, entries: Sequence[Check], cost: Optional[int] = None) -> Decision:
        """Several limits that must all hold: nothing is consumed unless every one allows."""
        try:
            resp = await self._send("POST", "/v1/check", _all_body(entries, cost, _key()))
            return _decision(resp)
        except LeveeUnavailable as e:
            results = self._fall_back(str(e), entries)
            return dataclasses.replace(results[0], results=results)

    async def batch(self, checks: Sequence[Check]) -> List[Decision]:
        """Many independent decisions in one request."""
        body = {"checks": [c.to_json(_key()) for c in checks]}
        try:
            resp = await self._send("POST", "/v1/check/batch", body,
                                    wait_ms=_longest_wait(checks))
        except LeveeUnavailable as e:
            return self._fall_back(str(e), checks)
        return [Decision.from_json(r) for r in resp.json()["results"]]

    async def refund(self, rule: str, key: str, cost: Optional[int] = None, *,
                     cls: Optional[str] = None,
                     idempotency_key: Optional[str] = None) -> Decision:
        """Gives tokens back; never refunded twice across retries."""
        c = Check(rule, key, cost, cls, False, idempotency_key)
        resp = await self._send("POST", "/v1/refund", c.to_json(_key()), self._refund_token)
        return _decision(resp)

    async def usage(self, rule: str, key: str) -> Usage:
        """The converged view of a key."""
        return Usage.from_json((await self._send("GET", _usage_path(rule, key))).json())

    async def put_override(self, rule: str, key: str, *, limit: Optional[int] = None,
                           rate: Optional[int] = None, burst: Optional[int] = None,
                           action: Optional[str] = None,
                           ttl: Optional[str] = None) -> Override:
        """Gives ``key`` its own figures, or puts it on a list (see ``Client.put_override``)."""
        body = _override_body(limit, rate, burst, action, ttl)
        resp = await self._send("PUT", _override_path(rule, key), body, self._admin_token)
        return Override.from_json(resp.json())

    async def get_override(self, rule: str, key: str) -> Optional[Override]:
        """The key's override, or ``None``."""
        try:
            resp = await self._send("GET", _override_path(rule, key))
        except LeveeApiError as e:
            if e.status == 404 and e.code == "not_found":
                return None
            raise
        return Override.from_json(resp.json())

    async def list_overrides(self, rule: str) -> List[Override]:
        """Every override of ``rule`` in force, by key."""
        resp = await self._send("GET", _override_path(rule))
        return [Override.from_json(o) for o in resp.json()["overrides"]]

    async def delete_override(self, rule: str, key: str) -> None:
        """Removes the key's override: the rule's own figures apply again."""
        await self._send("DELETE", _override_path(rule, key), None, self._admin_token)
