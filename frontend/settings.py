"""The frontend's settings, declared once: every one a CLI flag and an environment variable, read once at start."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from common.config import SettingsError, load, option, options, setting
from common.curve import KeyFile, check_client_keys, client_key_setting, server_key_setting
from common.logs import log_format_setting, log_level_setting


@dataclass(frozen=True)
class FrontendSettings:
    host: str = setting("POCSERVE_HOST", "127.0.0.1", "HTTP bind address")
    port: int = setting("POCSERVE_PORT", 8000, "HTTP port")
    backend_address: str = setting("POCSERVE_BACKEND_ADDRESS", "ipc:///tmp/pocserve/backend.ipc",
                                   "ZMQ address of the backend")
    # Loaded and checked at start; both set or both None (CURVE off).
    curve_client_secret_key_file: KeyFile | None = client_key_setting()
    curve_server_public_key_file: KeyFile | None = server_key_setting()
    frontend_id: str = setting("POCSERVE_FRONTEND_ID", "", "name in backend logs (default host-pid)")
    ping_interval_s: float = setting("POCSERVE_PING_INTERVAL_S", 0.5, "backend liveness ping period")
    backend_timeout_s: float = setting("POCSERVE_BACKEND_TIMEOUT_S", 1.5,
                                       "a ping's timeout, and the ZMQ heartbeat's: a connection silent this long is "
                                       "dropped and the backend counts as down")
    backend_wait_s: float = setting("POCSERVE_BACKEND_WAIT_S", 1.0,
                                    "how long a request waits for a down backend before 503")
    breaker_misses: int = setting("POCSERVE_BREAKER_MISSES", 3,
                                  "consecutive missed pings that open the breaker (requests then 503 at once)")
    backend_busy_s: float = setting("POCSERVE_BACKEND_BUSY_S", 30.0,
                                    "how long a backend still connected (its process up) may leave pings unanswered "
                                    "before it counts as hung: until then its streams and new requests wait")
    logprob_token_format: str = setting("POCSERVE_LOGPROB_TOKEN_FORMAT", "ids",
                                        "logprob token strings: ids (the Gonka network's format) or text (OpenAI's)",
                                        choices=("ids", "text"))
    enable_prompt_tokens_details: bool = setting(
        "POCSERVE_ENABLE_PROMPT_TOKENS_DETAILS", False,
        "show usage.prompt_tokens_details.cached_tokens, the prompt's prefix-cache hits (vLLM's flag of that name)")
    api_key: str = setting("POCSERVE_API_KEY", "",
                           "bearer token required on /v1/* (vLLM's --api-key; empty: no token needed)", secret=True)
    pow_api_token: str = setting("POCSERVE_POW_API_TOKEN", "",
                                 "bearer token required on /api/v1/pow/* (empty: no token needed)", secret=True)
    pow_wait_timeout_s: float = setting("POCSERVE_POW_WAIT_TIMEOUT_S", 600.0,
                                        "how long a /api/v1/pow/generate wait=true request may take before 503")
    max_body_bytes: int = setting("POCSERVE_MAX_BODY_BYTES", 32 * 1024 * 1024,
                                  "largest HTTP request body accepted (larger: 413)")
    # Slow and idle clients (frontend/connections.py).
    header_timeout_s: float = setting("POCSERVE_HEADER_TIMEOUT_S", 15.0,
                                      "close a connection that has waited this long for a complete request header")
    body_timeout_s: float = setting("POCSERVE_BODY_TIMEOUT_S", 30.0,
                                    "close a connection whose request body has not grown for this long")
    max_connections: int = setting("POCSERVE_MAX_CONNECTIONS", 0,
                                   "open HTTP connections at most (0: the file descriptor limit less 128); past it "
                                   "the connection longest idle is closed, or the new one answered 503")
    log_format: str = log_format_setting()
    log_level: str = log_level_setting()


OPTIONS = options(FrontendSettings)


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> FrontendSettings:
    s = load(FrontendSettings, "pocserve-frontend", "pocserve HTTP frontend", argv, environ)
    if not s.frontend_id:
        s = replace(s, frontend_id=f"{socket.gethostname()}-{os.getpid()}")
    check_client_keys(s.curve_client_secret_key_file, s.curve_server_public_key_file, s.backend_address,
                      option(FrontendSettings, "backend_address").names)
    for name in ("ping_interval_s", "backend_timeout_s", "backend_wait_s", "pow_wait_timeout_s", "header_timeout_s",
                 "body_timeout_s"):
        if getattr(s, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive")
    if s.max_body_bytes < 1024:
        raise SettingsError("--max-body-bytes must be at least 1024")
    if s.max_connections < 0:
        raise SettingsError("--max-connections must be 0 (automatic) or positive")
    if s.breaker_misses < 1:
        raise SettingsError("--breaker-misses must be at least 1")
    if s.backend_busy_s < 0:
        raise SettingsError("--backend-busy-s must be 0 (a silent backend is down after --backend-timeout-s) or more")
    return s
