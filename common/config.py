"""Settings plumbing shared by every process: each setting is a CLI flag and an environment variable.

A process declares its settings once, as a frozen dataclass whose fields are made by `setting(...)`; the flag is
the field name with dashes, the CLI parser and the README table are derived from the dataclass.
Precedence: CLI flag > environment variable > default. Values are parsed once, at process start.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
_SPEC = "pocserve.setting"


class SettingsError(ValueError):
    """A setting has an invalid value; the message names the flag and the variable."""


@dataclass(frozen=True)
class Option:
    """One setting as the parser sees it (derived from a settings dataclass field)."""

    name: str  # attribute name; the flag is --name-with-dashes
    env: str
    default: Any
    help: str
    type: type = str
    choices: tuple[str, ...] | None = None
    # Turns the parsed raw value (of `type`) into the field's value; raises SettingsError naming the setting.
    convert: Callable[[Option, Any], Any] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def names(self) -> str:
        """How error messages name it: "--flag / ENV"."""
        return f"{self.flag} / {self.env}"


@dataclass(frozen=True)
class _Spec:
    env: str
    help: str
    type: type | None
    choices: tuple[str, ...] | None
    convert: Callable[[Option, Any], Any] | None


def setting(env: str, default: Any, help: str, *, type: type | None = None, choices: tuple[str, ...] | None = None,
            convert: Callable[[Option, Any], Any] | None = None, secret: bool = False) -> Any:
    """A settings field. `type` is the raw type the flag takes (default: the field's annotation); `default` is a
    raw value too, given to `convert` like any other. A `secret` stays out of the settings' repr (and logs)."""
    return dataclasses.field(default=default, repr=not secret,
                             metadata={_SPEC: _Spec(env, help, type, choices, convert)})


def options(cls: type) -> tuple[Option, ...]:
    """The settings of a dataclass made of `setting(...)` fields, in declaration order."""
    hints = typing.get_type_hints(cls)
    result = []
    for f in dataclasses.fields(cls):
        spec: _Spec | None = f.metadata.get(_SPEC)
        if spec is None:  # a field the process fills in itself (e.g. the backend's vLLM arguments)
            continue
        raw_type = spec.type or hints[f.name]
        result.append(Option(f.name, spec.env, f.default, spec.help, raw_type, spec.choices, spec.convert))
    return tuple(result)


def option(cls: type, name: str) -> Option:
    return next(o for o in options(cls) if o.name == name)


def load(cls: type[T], prog: str, description: str, argv: Sequence[str] | None = None,
         environ: Mapping[str, str] | None = None) -> T:
    """Parses flags and environment into an instance of the settings dataclass `cls` (SettingsError if bad)."""
    return build(cls, parse_options(prog, description, options(cls), argv, environ))


def build(cls: type[T], values: Mapping[str, Any]) -> T:
    """The settings dataclass from parsed raw values (each converted); values of other options are left out."""
    fields = {}
    for opt in options(cls):
        fields[opt.name] = values[opt.name] if opt.convert is None else opt.convert(opt, values[opt.name])
    return cls(**fields)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _from_env(opt: Option, raw: str) -> Any:
    try:
        return parse_bool(raw) if opt.type is bool else opt.type(raw)
    except ValueError:
        raise SettingsError(f"{opt.env}={raw!r} is not a valid {opt.type.__name__}") from None


def parse_options(prog: str, description: str, options: Sequence[Option], argv: Sequence[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_options(parser, options, environ)
    return check_choices(vars(parser.parse_args(argv)), options)


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option],
                environ: Mapping[str, str] | None = None) -> None:
    """The settings as flags of `parser`, each defaulting to its environment variable where that is set."""
    environ = os.environ if environ is None else environ
    for opt in options:
        default = _from_env(opt, environ[opt.env]) if opt.env in environ else opt.default
        help_text = f"{opt.help} (env {opt.env}; default {opt.default!r})"
        if opt.type is bool:
            parser.add_argument(opt.flag, dest=opt.name, default=default, help=help_text,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(opt.flag, dest=opt.name, default=default, help=help_text, type=opt.type,
                                choices=opt.choices)


def check_choices(values: dict[str, Any], options: Sequence[Option]) -> dict[str, Any]:
    """argparse checks choices on the command line only; a value from the environment is checked here."""
    for opt in options:
        if opt.choices and values[opt.name] not in opt.choices:
            raise SettingsError(f"{opt.names}: {values[opt.name]!r} is not one of {list(opt.choices)}")
    return values


def parse_bool(raw: str) -> bool:
    """An environment variable's boolean ("1", "true", "yes", "on" or "0", "false", "no", "off", "")."""
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(raw)


def path(_opt: Option, raw: str) -> Path:
    """`convert` for directory and file settings: ~ expanded."""
    return Path(os.path.expanduser(raw))
