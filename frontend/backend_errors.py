"""How a backend call fails, as the routes see it (raised by frontend/backend_client.py)."""

from __future__ import annotations

from protocol.common import ErrorInfo


class BackendUnavailable(Exception):
    """The backend cannot take or finish this request now: answer 503."""


class BackendRequestError(Exception):
    """The backend refused or failed one request (its ErrorInfo says how to answer)."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info
