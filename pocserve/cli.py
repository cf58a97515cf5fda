"""vLLM's own api_server command line, parsed by vLLM's own parser: every flag vLLM accepts parses here.

What the launcher needs beyond vLLM's namespace is which options were actually given (a flag given with any
value, even vLLM's default, counts as given): the backend's parse tells it (backend/startup/vllm_args.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from common.config import SettingsError

PROG = "pocserve.api_server"


class UsageError(Exception):
    """The command line does not parse; the message is one line naming the offending argument."""


@dataclass(frozen=True)
class Parsed:
    values: dict[str, Any]  # vLLM's namespace: every option's value, given or default
    defaults: dict[str, Any]  # vLLM's default of every option
    given: frozenset[str]  # the options present on the command line


@dataclass(frozen=True)
class Early:
    """The few options that can be checked before vLLM's parser is imported (seconds, under load tens of
    seconds): a missing model directory or a port in use fails at once. The full parse decides again."""

    model: str | None
    revision: str | None
    download_dir: str | None
    host: str | None
    port: int | None


def early_options(argv: Sequence[str]) -> Early:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for flag in ("--model", "--revision", "--download-dir", "--host", "--port"):
        parser.add_argument(flag)
    try:
        known, _rest = parser.parse_known_args(list(argv))
    except argparse.ArgumentError:  # e.g. a flag without its value: vLLM's parser says so
        return Early(None, None, None, None, None)
    port = int(known.port) if known.port is not None and known.port.isdigit() else None
    return Early(known.model, known.revision, known.download_dir, known.host, port)


def build_parser():
    """vLLM's serve parser, raising UsageError instead of printing usage and exiting."""
    # vLLM's import-time notices (e.g. no Triton on CPU) would bury the one line a bad flag earns; the children
    # get the original environment (the supervisor copies it before this runs).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from backend.engine.compat import serve_parser

    def on_error(message: str) -> NoReturn:
        raise UsageError(" ".join(message.split()))

    return serve_parser(PROG, "pocserve behind vLLM's api_server command line", on_error)

def parse(argv: Sequence[str]) -> Parsed:
    """The command line through vLLM's parser, and which options it gave (the backend's reading, without its
    POCSERVE_<NAME> variables: the launcher's command line is vLLM's alone)."""
    from backend.startup.vllm_args import parse as parse_given
    from backend.startup.vllm_args import vllm_actions

    parser = build_parser()
    actions = vllm_actions(parser)
    try:
        values, given = parse_given(parser, actions, argv, {})
    except SettingsError as e:  # vLLM's own checks (a --config file, `serve` misuse) raise ValueError or OSError
        raise UsageError(str(e)) from None
    return Parsed(values, {dest: parser.get_default(dest) for dest in values}, given)
