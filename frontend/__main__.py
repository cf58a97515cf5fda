"""Frontend process entry: settings, logging, uvicorn."""

from __future__ import annotations

import sys

import uvicorn

from common.config import SettingsError
from common.logs import configure_logging
from common.process import refuse
from frontend.app import create_app
from frontend.connections import ConnectionGuard, default_max_connections, http_protocol
from frontend.settings import load_settings


def main(argv: list[str] | None = None) -> None:
    try:
        settings = load_settings(argv)
    except SettingsError as e:
        sys.exit(refuse("pocserve-frontend", e))
    configure_logging(settings.log_format, settings.log_level)
    guard = ConnectionGuard(settings.max_connections or default_max_connections(), settings.header_timeout_s,
                            settings.body_timeout_s)
    # timeout_keep_alive: uvicorn's 5 s default, written out; the guard adds what uvicorn lacks (its docstring).
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_config=None,
                timeout_graceful_shutdown=5, timeout_keep_alive=5, http=http_protocol(guard))


if __name__ == "__main__":
    main()
