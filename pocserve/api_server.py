"""`python -m pocserve.api_server`: pocserve in place of `python -m vllm.entrypoints.openai.api_server`.

The Gonka ML node starts its inference server as
    python -m $MLNODE_VLLM_MODULE --model M --dtype D --port P --host 0.0.0.0 <vLLM flags> \\
        --worker-extension-cls gonka_poc.worker.PoCWorkerExtension
and MLNODE_VLLM_MODULE=pocserve.api_server makes that one pocserve instance: a backend and a frontend serving HTTP
on --host/--port. Bad input (a flag vLLM does not know, one pocserve cannot honour, a missing model directory, a
port in use) is one line on stderr naming it, and exit status 2, before anything starts.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import structlog

from common.config import SettingsError
from common.logs import configure_logging
from common.process import refuse, set_title
from pocserve.cli import PROG, Early, UsageError, early_options, parse
from pocserve.flags import DEFAULT_HOST, Plan, Refusal, translate
from pocserve.instance import BACKEND_FIXED, InstanceError, check_port_free, prepare, resolve_model
from pocserve.settings import load_settings
from pocserve.supervisor import Supervisor

log = structlog.get_logger("pocserve.api_server")


def main(argv: list[str] | None = None) -> None:
    environ = dict(os.environ)  # what the children get: taken before vLLM's parser is imported
    try:
        settings = load_settings(environ)
        argv = sys.argv[1:] if argv is None else argv
        precheck(early_options(argv))
        plan = translate(parse(argv), argv, settings.vllm_api_key)
        check_backend(plan, environ)
        instance = prepare(plan, settings.state_root)
    except (UsageError, Refusal, InstanceError, SettingsError) as e:
        _exit(refuse(PROG, e))
    configure_logging(settings.log_format, settings.log_level)
    set_title(f"pocserve-api-server-{plan.port}")
    for flag, why in plan.ignored:
        log.warning("vllm_flag_ignored", flag=flag, why=why)
    try:
        code = Supervisor(instance.children(environ), settings.stop_timeout_s).run(**instance.describe())
    finally:
        instance.remove_run_dir()
    _exit(code)


def precheck(early: Early) -> None:
    """Model and port checked before vLLM's parser is imported, so that these mistakes fail in a second."""
    if early.model is not None:
        resolve_model(early.model, early.revision, early.download_dir)
    if early.port is not None:
        check_port_free(early.host or DEFAULT_HOST, early.port)


def check_backend(plan: Plan, environ: dict[str, str]) -> None:
    """The backend's own reading of the command line, here: an engine flag it refuses, or a bad POCSERVE_*
    value, fails before anything starts, with the line the backend would print."""
    from backend.startup.settings import load_settings as backend_settings

    backend_settings([*plan.backend_args, *BACKEND_FIXED], environ)


def _exit(code: int) -> NoReturn:
    """Exits without the interpreter's teardown: with vLLM's parser (and torch) imported it takes seconds, and the
    ML node times our stop. Nothing here needs it: the children are gone and the logs are flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
