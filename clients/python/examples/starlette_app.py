"""A search API limited per tenant by Levee: 1,000 searches a minute per tenant.

The node runs a rule such as

    [[rule]]
    name = "search-per-tenant"
    algorithm = "fixed_window"
    limit = 1000
    window = "1m"

and this app asks it before each search, from a Starlette middleware (FastAPI is Starlette:
``app.add_middleware(LeveeMiddleware, ...)`` works the same). Run with
``LEVEE_URL=http://127.0.0.1:8750 uvicorn starlette_app:app``.
"""

from __future__ import annotations

import os
from typing import Awaitable, Callable, Optional

from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from levee_client import AsyncClient


class LeveeMiddleware(BaseHTTPMiddleware):
    """Checks each request against ``rule`` with the key ``key_of(request)`` returns (no key:
    400). Denied: 429 with Levee's rate-limit headers and Retry-After; allowed: the app's answer
    with the rate-limit headers added."""

    def __init__(
        self,
        app: ASGIApp,
        levee: AsyncClient,
        rule: str,
        key_of: Callable[[Request], Optional[str]],
    ) -> None:
        super().__init__(app)
        self.levee = levee
        self.rule = rule
        self.key_of = key_of

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        key = self.key_of(request)
        if key is None:
            return JSONResponse({"error": "missing_key", "message": "X-Tenant is required"}, 400)
        d = await self.levee.check(self.rule, key)
        if not d.allowed:
            headers = dict(d.headers)
            headers.setdefault("retry-after", str(max(1, -(-d.retry_after_ms // 1000))))
            return JSONResponse(
                {"error": "rate_limited", "retry_after_ms": d.retry_after_ms}, 429, headers
            )
        response = await call_next(request)
        for name, value in d.headers.items():
            if name != "retry-after":
                response.headers[name] = value
        return response


async def search(request: Request) -> Response:
    return JSONResponse({"tenant": request.headers["x-tenant"], "hits": []})


def create_app(levee: AsyncClient) -> Starlette:
    app = Starlette(routes=[Route("/search", search)])
    app.add_middleware(
        LeveeMiddleware,
        levee=levee,
        rule="search-per-tenant",
        key_of=lambda r: r.headers.get("x-tenant"),
    )
    return app


app = create_app(AsyncClient(os.environ.get("LEVEE_URL", "http://127.0.0.1:8750"),
                             fallback="open"))
