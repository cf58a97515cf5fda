"""The launcher's own settings, declared once and read from the environment only (its command line is vLLM's).

Everything else reaches the backend and frontend as they read it themselves: the POCSERVE_* / POC_* variables an
operator sets are inherited by both children, and the flags the launcher passes (mapped from vLLM's) win over them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.config import SettingsError, load, path, setting
from common.logs import log_format_setting, log_level_setting


@dataclass(frozen=True)
class LauncherSettings:
    state_root: Path = setting("POCSERVE_STATE_ROOT", "state",
                               "directory under which each instance keeps its state, in port-<port>/ (queued jobs, "
                               "results, undelivered callbacks survive a restart on the same port)",
                               type=str, convert=path)
    stop_timeout_s: float = setting("POCSERVE_STOP_TIMEOUT_S", 15.0,
                                    "after SIGINT/SIGTERM, how long the backend and frontend get to stop before "
                                    "they are killed (the ML node kills at 20 s)")
    # vLLM's api_server reads its key from here when --api-key is absent; so do we.
    vllm_api_key: str = setting("VLLM_API_KEY", "", "vLLM's API key variable (as --api-key)", secret=True)
    log_format: str = log_format_setting()
    log_level: str = log_level_setting()


def load_settings(environ: Mapping[str, str] | None = None) -> LauncherSettings:
    s = load(LauncherSettings, "pocserve.api_server", "pocserve launcher settings", [], environ)
    if not s.stop_timeout_s > 0:
        raise SettingsError("POCSERVE_STOP_TIMEOUT_S must be positive")
    return s
