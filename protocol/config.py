"""Settings plumbing shared by every process: each option is a CLI flag and an environment variable.

Not a wire struct: this lives in `protocol/` only because it is the one package every process may import.
Precedence: CLI flag > environment variable > default. Values are parsed once, at process start.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    name: str  # attribute name; the flag is --name-with-dashes
    env: str
    default: Any
    help: str
    type: type = str
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A setting has an invalid value; the message names the flag and the variable."""


def _from_env(opt: Option, raw: str) -> Any:
    try:
        if opt.type is bool:
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        return opt.type(raw)
    except ValueError:
        raise SettingsError(f"{opt.env}={raw!r} is not a valid {opt.type.__name__}") from None


def parse_options(
    prog: str, description: str, options: Sequence[Option], argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for opt in options:
        default = _from_env(opt, environ[opt.env]) if opt.env in environ else opt.default
        help_text = f"{opt.help} (env {opt.env}; default {opt.default!r})"
        if opt.type is bool:
            parser.add_argument(opt.flag, dest=opt.name, default=default, help=help_text,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(opt.flag, dest=opt.name, default=default, help=help_text, type=opt.type,
                                choices=opt.choices)
    values = vars(parser.parse_args(argv))
    for opt in options:
        if opt.choices and values[opt.name] not in opt.choices:
            raise SettingsError(f"{opt.flag} / {opt.env}: {values[opt.name]!r} is not one of {list(opt.choices)}")
    return values
