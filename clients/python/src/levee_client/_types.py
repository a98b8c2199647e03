"""Answers, checks and errors of the Levee HTTP API (docs/api.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Mapping, Optional

Fallback = Literal["error", "open", "closed"]
"""What a call answers when no node answered in time: raise ``LeveeUnavailable``
(``"error"``, the default), allow (``"open"``) or deny (``"closed"``)."""


class LeveeError(Exception):
    """Base of every error of this package."""


class LeveeApiError(LeveeError):
    """The node refused the request (4xx): ``status``, ``code`` (e.g. ``invalid_request``,
    ``unknown_rule``) and ``message`` as the node answered."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class LeveeUnavailable(LeveeError):
    """No node answered in time (after every retry) and the fallback is ``"error"``."""


@dataclass(frozen=True)
class Check:
    """One check, as in ``POST /v1/check``."""

    rule: str
    key: str
    cost: Optional[int] = None
    cls: Optional[str] = None
    """The consumer class (``class`` on the wire), for rules with classes."""
    dry_run: bool = False
    idempotency_key: Optional[str] = None
    max_wait_ms: Optional[int] = None
    """How long the node may wait for rights, in ms (0 to 10,000; API.md "Waiting for
    rights"): the call's timeout grows by as much."""

    def to_json(self, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"rule": self.rule, "key": self.key}
        if self.cost is not None:
            body["cost"] = self.cost
        if self.cls is not None:
            body["class"] = self.cls
        if self.dry_run:
            body["dry_run"] = True
        if self.max_wait_ms is not None:
            body["max_wait_ms"] = self.max_wait_ms
        key = self.idempotency_key or idempotency_key
        if key is not None and not self.dry_run:
            body["idempotency_key"] = key
        return body


@dataclass(frozen=True)
class Decision:
    """A decision (``/v1/check``, each entry of a batch, a refund's figures)."""

    allowed: bool
    rule: str
    key: str
    limit: int
    remaining: int
    reset_after_ms: int
    retry_after_ms: int
    mode: str = "enforce"
    degraded: bool = False
    local_remaining: Optional[int] = None
    list: Optional[str] = None
    """``"allow"`` or ``"deny"`` when the key is on a list (an override with ``action``)."""
    results: Optional[List["Decision"]] = None
    """For an ``all`` call: one decision per entry, in order."""
    waited_ms: Optional[int] = None
    """How long the node waited for rights, when the check gave ``max_wait_ms``."""
    fallback: bool = False
    """True when this client decided because no node answered."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The node's rate-limit headers (``RateLimit-Policy``, ``RateLimit``, ``X-RateLimit-*``,
    ``Retry-After``), lower-case names, to pass on to your own callers."""

    @staticmethod
    def from_json(v: Mapping[str, Any], headers: Optional[Mapping[str, str]] = None) -> "Decision":
        results = v.get("results")
        return Decision(
            allowed=bool(v["allowed"]),
            rule=str(v.get("rule", "")),
            key=str(v.get("key", "")),
            limit=int(v.get("limit", 0)),
            remaining=int(v.get("remaining", 0)),
            reset_after_ms=int(v.get("reset_after_ms", 0)),
            retry_after_ms=int(v.get("retry_after_ms", 0)),
            mode=str(v.get("mode", "enforce")),
            degraded=bool(v.get("degraded", False)),
            local_remaining=v.get("local_remaining"),
            list=v.get("list"),
            waited_ms=v.get("waited_ms"),
            results=[Decision.from_json(r) for r in results] if results is not None else None,
            headers=dict(headers or {}),
        )

    @staticmethod
    def of_fallback(rule: str, key: str, allowed: bool) -> "Decision":
        return Decision(
            allowed=allowed,
            rule=rule,
            key=key,
            limit=0,
            remaining=0,
            reset_after_ms=0,
            retry_after_ms=0 if allowed else 1000,
            degraded=True,
            fallback=True,
        )


@dataclass(frozen=True)
class Usage:
    """``GET /v1/usage/{rule}/{key}``: the converged view of a key across regions."""

    rule: str
    key: str
    limit: int
    used: int
    remaining: int
    reset_after_ms: int
    regions: Dict[str, int]
    owner: Optional[str] = None

    @staticmethod
    def from_json(v: Mapping[str, Any]) -> "Usage":
        return Usage(
            rule=str(v["rule"]),
            key=str(v["key"]),
            limit=int(v["limit"]),
            used=int(v["used"]),
            remaining=int(v["remaining"]),
            reset_after_ms=int(v["reset_after_ms"]),
            regions={str(k): int(n) for k, n in dict(v.get("regions", {})).items()},
            owner=v.get("owner"),
        )


@dataclass(frozen=True)
class Override:
    """A per-key override (``/v1/overrides/{rule}/{key}``): the key's own ``limit``, or
    ``rate`` and ``burst``, or ``action`` (``"allow"`` / ``"deny"``), and how long it has left
    (``expires_in_ms``; ``None``: until deleted)."""

    rule: str
    key: str
    limit: Optional[int] = None
    rate: Optional[int] = None
    burst: Optional[int] = None
    action: Optional[str] = None
    expires_in_ms: Optional[int] = None

    @staticmethod
    def from_json(v: Mapping[str, Any]) -> "Override":
        def num(name: str) -> Optional[int]:
            x = v.get(name)
            return None if x is None else int(x)

        action = v.get("action")
        return Override(
            rule=str(v["rule"]),
            key=str(v["key"]),
            limit=num("limit"),
            rate=num("rate"),
            burst=num("burst"),
            action=None if action is None else str(action),
            expires_in_ms=num("expires_in_ms"),
        )
