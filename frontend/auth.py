"""Bearer tokens, checked before anything else of a request: before routing, reading the body or decoding it.

vLLM's --api-key guards every path under /v1 the same way, in an ASGI middleware
(vllm/entrypoints/serve/middleware/authenticate.py); the PoC routes have a token of their own. As a route
dependency the check ran only after FastAPI had decoded the body, so a malformed body sent without a token was
answered 400, telling an unauthenticated client how its body was read, rather than 401.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from frontend.errors import error_response


class BearerGuard:
    """Answers 401 to a request under a guarded path prefix without `Authorization: Bearer <that prefix's token>`.

    `guards` are (path prefix, token) pairs; an empty token guards nothing. OPTIONS passes, as in vLLM: a CORS
    preflight carries no credentials."""

    def __init__(self, app, guards: Sequence[tuple[str, str]]) -> None:
        self.app = app
        self.guards = [(prefix, token.encode()) for prefix, token in guards if token]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            for prefix, token in self.guards:
                if (path == prefix or path.startswith(prefix + "/")) and not _bears(scope, token):
                    await error_response(401, f"missing or invalid bearer token for {prefix}",
                                         headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _bears(scope, token: bytes) -> bool:
    value = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
    scheme, _, given = value.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)
