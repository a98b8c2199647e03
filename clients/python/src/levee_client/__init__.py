"""A typed client for the Levee rate limiter (docs/api.md): ``Client`` (blocking) and
``AsyncClient`` (asyncio), over httpx.

    from levee_client import Client
    with Client("http://127.0.0.1:8750") as levee:
        d = levee.check("search-per-tenant", "acme")
        if not d.allowed:
            ...  # 429, Retry-After: d.retry_after_ms
"""

from ._client import AsyncClient, Client
from ._types import (
    Check,
    Decision,
    Fallback,
    LeveeApiError,
    LeveeError,
    LeveeUnavailable,
    Override,
    Usage,
)

__all__ = [
    "AsyncClient",
    "Check",
    "Client",
    "Decision",
    "Fallback",
    "LeveeApiError",
    "LeveeError",
    "LeveeUnavailable",
    "Override",
    "Usage",
]
__version__ = "0.1.0"
