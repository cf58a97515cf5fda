"""The frontend's settings: every one a CLI flag and an environment variable, read once at start."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol.config import Option, SettingsError, parse_options
from protocol.curve import KeyFile, load_public_key_file, load_secret_key_file

OPTIONS: tuple[Option, ...] = (
    Option("host", "POCSERVE_HOST", "127.0.0.1", "HTTP bind address"),
    Option("port", "POCSERVE_PORT", 8000, "HTTP port", int),
    Option("backend_address", "POCSERVE_BACKEND_ADDRESS", "ipc:///tmp/pocserve/backend.ipc",
           "ZMQ address of the backend"),
    Option("curve_client_secret_key_file", "POCSERVE_CURVE_CLIENT_SECRET_KEY_FILE", "",
           "CURVE: this frontend's secret key file (NAME.key_secret); its NAME.key must be in the backend's "
           "--curve-clients-dir (empty: plaintext)"),
    Option("curve_server_public_key_file", "POCSERVE_CURVE_SERVER_PUBLIC_KEY_FILE", "",
           "CURVE: the backend's public key file (NAME.key); set with --curve-client-secret-key-file"),
    Option("frontend_id", "POCSERVE_FRONTEND_ID", "", "name in backend logs (default host-pid)"),
    Option("ping_interval_s", "POCSERVE_PING_INTERVAL_S", 0.5, "backend liveness ping period", float),
    Option("backend_timeout_s", "POCSERVE_BACKEND_TIMEOUT_S", 1.5,
           "backend counts as down after this long without an answer", float),
    Option("backend_wait_s", "POCSERVE_BACKEND_WAIT_S", 1.0,
           "how long a request waits for a down backend before 503", float),
    Option("breaker_misses", "POCSERVE_BREAKER_MISSES", 3,
           "consecutive missed pings that open the breaker (requests then 503 at once)", int),
    Option("logprob_token_format", "POCSERVE_LOGPROB_TOKEN_FORMAT", "ids",
           "logprob token strings: ids (the Gonka network's format) or text (OpenAI's)",
           choices=("ids", "text")),
    Option("pow_api_token", "POCSERVE_POW_API_TOKEN", "",
           "bearer token required on /api/v1/pow/* (empty: no token needed)"),
    Option("pow_wait_timeout_s", "POCSERVE_POW_WAIT_TIMEOUT_S", 600.0,
           "how long a /api/v1/pow/generate wait=true request may take before 503", float),
    Option("batch_size_default", "POC_BATCH_SIZE_DEFAULT", 32,
           "PoC batch_size when a /api/v1/pow request omits it (the fork's variable)", int),
    Option("max_body_bytes", "POCSERVE_MAX_BODY_BYTES", 32 * 1024 * 1024,
           "largest HTTP request body accepted (larger: 413)", int),
    Option("log_format", "POCSERVE_LOG_FORMAT", "console", "log output", choices=("console", "json")),
    Option("log_level", "POCSERVE_LOG_LEVEL", "info", "log level",
           choices=("debug", "info", "warning", "error")),
)

_OPTIONS = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class FrontendSettings:
    host: str
    port: int
    backend_address: str
    # Loaded and checked at start; both set or both None (CURVE off).
    curve_client_secret_key_file: KeyFile | None
    curve_server_public_key_file: KeyFile | None
    frontend_id: str
    ping_interval_s: float
    backend_timeout_s: float
    backend_wait_s: float
    breaker_misses: int
    logprob_token_format: str
    # Kept out of repr so that logging the settings never prints the secret.
    pow_api_token: str = field(repr=False)
    pow_wait_timeout_s: float
    batch_size_default: int
    max_body_bytes: int
    log_format: str
    log_level: str


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> FrontendSettings:
    values = parse_options("pocserve-frontend", "pocserve HTTP frontend", OPTIONS, argv, environ)
    if not values["frontend_id"]:
        values["frontend_id"] = f"{socket.gethostname()}-{os.getpid()}"
    values["curve_client_secret_key_file"] = load_secret_key_file(
        _OPTIONS["curve_client_secret_key_file"], values["curve_client_secret_key_file"])
    values["curve_server_public_key_file"] = load_public_key_file(
        _OPTIONS["curve_server_public_key_file"], values["curve_server_public_key_file"])
    s = FrontendSettings(**values)
    if (s.curve_client_secret_key_file is None) != (s.curve_server_public_key_file is None):
        raise SettingsError("--curve-client-secret-key-file / POCSERVE_CURVE_CLIENT_SECRET_KEY_FILE and "
                            "--curve-server-public-key-file / POCSERVE_CURVE_SERVER_PUBLIC_KEY_FILE must be set "
                            "together")
    if s.curve_client_secret_key_file is not None and s.backend_address.startswith("inproc://"):
        # inproc has no ZMTP handshake, so CURVE would silently do nothing there.
        raise SettingsError("--backend-address / POCSERVE_BACKEND_ADDRESS: CURVE needs an ipc:// or tcp:// address")
    for name in ("ping_interval_s", "backend_timeout_s", "backend_wait_s", "pow_wait_timeout_s"):
        if getattr(s, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive")
    if s.max_body_bytes < 1024:
        raise SettingsError("--max-body-bytes must be at least 1024")
    if s.breaker_misses < 1:
        raise SettingsError("--breaker-misses must be at least 1")
    if s.batch_size_default < 1:
        raise SettingsError("--batch-size-default / POC_BATCH_SIZE_DEFAULT must be at least 1")
    return s
