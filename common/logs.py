"""structlog set-up shared by every process: JSON in containers, console locally, stdlib logs routed through it.

Process plumbing shared by every process (common/).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

from common.config import setting


def configure_logging(fmt: str = "console", level: str = "info") -> None:
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = (structlog.processors.JSONRenderer() if fmt == "json"
                else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(model_output_errors_in_one_line)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # vLLM and uvicorn install their own handlers; route them through ours instead.
    for name in ("vllm", "uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


# vLLM's tool parsers log a traceback at error level when the model's output is not the tool-call syntax they
# parse (the text is then returned as content, the request succeeds). That is the model's output, not a fault of the
# server: one warning line with the reason, so that a traceback in a log still means an error of ours.
MODEL_OUTPUT_LOGGERS = "vllm.tool_parsers"


def model_output_errors_in_one_line(record: logging.LogRecord) -> bool:
    if record.exc_info and (record.name + ".").startswith(MODEL_OUTPUT_LOGGERS + "."):
        exc = record.exc_info[1]
        record.msg = f"{record.getMessage()} ({type(exc).__name__}: {exc})"
        record.args, record.exc_info, record.exc_text = None, None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


def log_format_setting() -> Any:
    """The --log-format setting every process declares."""
    return setting("POCSERVE_LOG_FORMAT", "console", "log output", choices=("console", "json"))


def log_level_setting() -> Any:
    """The --log-level setting every process declares."""
    return setting("POCSERVE_LOG_LEVEL", "info", "log level", choices=("debug", "info", "warning", "error"))


def process_uptime_s() -> float | None:
    """Seconds since this process started (Linux /proc; None elsewhere): start events log it, so a slow start
    shows whether the time went before the engine (imports, spawns) or in it."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime, after boot
        with open("/proc/uptime") as f:
            boot_uptime_s = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(boot_uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"), 1)
