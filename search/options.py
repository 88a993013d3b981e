"""Declared options of the search strategies.

Each strategy lists its options (name, type, default, one-line meaning); the declaration is
the only place they are defined: it checks what a job, the CLI or the replay passes (an
unknown option or a bad value is an OptionError that names the option and lists the known
ones), converts `key=value` text, and writes the strategy's docstring and --help text.

This module imports nothing heavy: the CLI and the API read declarations through it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

# The types an option may have; JSON carries each of them as it is.
OPTION_TYPES: tuple[type, ...] = (int, float, str)


class OptionError(ValueError):
    """A strategy option that is unknown or has a bad value; `option` names it."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"{option}: {reason}")
        self.option = option
        self.reason = reason


@dataclass(frozen=True)
class Option:
    name: str
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    # Bounds what one job can make the explorer spend (walkers, trees, ...).
    maximum: float | None = None

    def __post_init__(self) -> None:
        if self.type not in OPTION_TYPES:
            raise TypeError(f"option {self.name}: type must be int, float or str")
        self.check(self.default)  # a declaration whose default it refuses is a bug

    def check(self, value: Any) -> Any:
        """`value` as this option's type, or OptionError saying why it cannot be."""
        # bool is an int to Python but never a number of trees or walkers.
        if isinstance(value, bool):
            raise OptionError(self.name, f"must be {self._kind()}, got {value!r}")
        if self.type is int:
            if not isinstance(value, int):
                raise OptionError(self.name, f"must be an integer, got {value!r}")
        elif self.type is float:
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise OptionError(self.name, f"must be a finite number, got {value!r}")
            value = float(value)
        elif not isinstance(value, str):
            raise OptionError(self.name, f"must be a string, got {value!r}")
        if self.choices and value not in self.choices:
            raise OptionError(self.name, f"unknown {self.name} {value!r}: "
                                         f"{' or '.join(map(str, self.choices))}")
        if self.minimum is not None and value < self.minimum:
            raise OptionError(self.name, f"must be >= {self.minimum:g}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise OptionError(self.name, f"must be <= {self.maximum:g}, got {value!r}")
        return value

    def parse(self, text: str) -> Any:
        """A `key=value` text value (CLI, replay specs) as this option's type."""
        try:
            value: Any = self.type(text) if self.type is not str else text
        except ValueError:
            raise OptionError(self.name, f"must be {self._kind()}, got {text!r}") from None
        return self.check(value)

    def _kind(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        return {int: "an integer", float: "a number", str: "a string"}[self.type]

    def describe(self) -> str:
        """One line: name (type, default): meaning."""
        kind = "|".join(map(str, self.choices)) if self.choices else self.type.__name__
        if self.minimum is not None and self.maximum is not None:
            kind += f" {self.minimum:g}..{self.maximum:g}"
        elif self.minimum is not None:
            kind += f" >= {self.minimum:g}"
        elif self.maximum is not None:
            kind += f" <= {self.maximum:g}"
        return f"{self.name} ({kind}, default {self.default!r}): {self.help}"


def with_defaults(options: Iterable[Option], **defaults: Any) -> tuple[Option, ...]:
    """The same declarations with other defaults (a subclass's own configuration)."""
    out = tuple(replace(o, default=defaults.pop(o.name)) if o.name in defaults else o
                for o in options)
    if defaults:
        raise TypeError(f"no such option: {', '.join(defaults)}")
    return out


def known(options: Iterable[Option]) -> str:
    names = [o.name for o in options]
    return ", ".join(names) if names else "none"


def resolve(strategy: str, options: Iterable[Option], given: Mapping[str, Any]
            ) -> dict[str, Any]:
    """Every declared option's value: the given one (checked) or its default."""
    declared = {o.name: o for o in options}
    for name in given:
        if name not in declared:
            raise OptionError(name, f"unknown option of strategy {strategy!r}; "
                                    f"known: {known(declared.values())}")
    return {name: o.check(given[name]) if name in given else o.default
            for name, o in declared.items()}


def parse_pairs(strategy: str, options: Iterable[Option], pairs: Iterable[str]
                ) -> dict[str, Any]:
    """`key=value` texts as typed option values (unknown keys and bad values refused)."""
    declared = {o.name: o for o in options}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq:
            raise OptionError(key, f"write options as key=value, got {pair!r}")
        if key not in declared:
            raise OptionError(key, f"unknown option of strategy {strategy!r}; "
                                   f"known: {known(declared.values())}")
        out[key] = declared[key].parse(raw)
    return out


def options_lines(options: Iterable[Option], indent: int = 4, width: int = 96) -> list[str]:
    """One wrapped entry per option (the continuation lines indented further)."""
    pad = " " * indent
    return [line for o in options
            for line in textwrap.wrap(o.describe(), width, initial_indent=pad,
                                      subsequent_indent=pad + "    ")]


def options_doc(options: Iterable[Option]) -> str:
    """The options section of a strategy's docstring."""
    lines = options_lines(options)
    return "Options:\n" + ("\n".join(lines) if lines else "    none")
