"""Command-line options declared as dataclass fields, and the parser generated from them.

An options dataclass declares each option once, as a field: its name is the attribute the
command reads, its default the option's, and `option(...)` in its metadata the flag, its help
and what argparse needs to parse it (type, nargs, choices, metavar). `add_options(parser, Cls)`
adds them all; `read_options(Cls, args)` gives the dataclass back from what was parsed. A
command is then a dataclass of its options plus a function of it (as vidur's
config/flat_dataclass.py does for its configs). A help text may say %(default)s.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

Options = TypeVar("Options")
CLI = "cli"  # the metadata key of an option's declaration
SHARED = "cli_shared"  # ... of a shared option's: (adder, its keyword arguments)
NESTED = "cli_nested"  # ... of a group's: its options dataclass
EXCLUSIVE = "cli_exclusive"  # ... of the mutually exclusive group an option joins
ALONG = "cli_along"  # ... of an option another field's adder adds
POSITIONAL = ""  # option()'s flag for a positional argument: named as its field


def option(flag: str, help: str, *, exclusive: tuple[str, bool] | None = None, **parse: Any) -> dict:
    """A field's metadata declaring it as `flag`: its help and how argparse parses it
    (type=, nargs=, choices=, metavar=, action=); exclusive as for shared(). A flag without a
    leading dash declares a positional argument (POSITIONAL)."""
    return {CLI: {"flag": flag, "help": help, **parse}, EXCLUSIVE: exclusive}


def shared(adder: Callable[..., None], *, exclusive: tuple[str, bool] | None = None, **kwargs: Any) -> dict:
    """A field's metadata declaring it as a shared option: `adder(target, **kwargs)` adds it
    (perfmodel.cli.options.model, .gpu, ...), under the field's name. exclusive: (group,
    required), the mutually exclusive group of that name it joins (--gpu or --spec)."""
    return {SHARED: (adder, kwargs), EXCLUSIVE: exclusive}


def along(adder_field: str) -> dict:
    """A field's metadata declaring it as an option that another field's shared adder adds
    with its own (options.step_point adds --tree-size, --batch and --context)."""
    return {ALONG: adder_field}


def nested(cls) -> dict:
    """A field's metadata declaring it as the group of options `cls` declares."""
    return {NESTED: cls}


def declared(cls) -> list[dataclasses.Field]:
    """The fields of `cls` that are options or groups, in declaration order."""
    return [f for f in dataclasses.fields(cls) if {CLI, SHARED, NESTED, ALONG} & set(f.metadata)]


def default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_options(target: argparse._ActionsContainer, cls) -> None:
    """Add every option `cls` declares to a parser or group, under the field's name."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in declared(cls):
        if NESTED in f.metadata:
            add_options(target, f.metadata[NESTED])
            continue
        if ALONG in f.metadata:
            continue
        where = target
        if f.metadata[EXCLUSIVE] is not None:
            name, required = f.metadata[EXCLUSIVE]
            if name not in groups:
                groups[name] = target.add_mutually_exclusive_group(required=required)
            where = groups[name]
        if SHARED in f.metadata:
            adder, kwargs = f.metadata[SHARED]
            adder(where, **kwargs)
            continue
        spec = dict(f.metadata[CLI])
        flag = spec.pop("flag")
        if flag.startswith("-"):
            where.add_argument(flag, dest=f.name, default=default_of(f), **spec)
        else:  # a positional argument: argparse names it by its flag, the field's name
            where.add_argument(f.name, **spec)


def read_options(cls: type[Options], args: argparse.Namespace) -> Options:
    """The options dataclass from a parse of a parser add_options() built."""
    return cls(**{f.name: read_field(f, args) for f in declared(cls)})


def read_field(f: dataclasses.Field, args: argparse.Namespace):
    if NESTED in f.metadata:
        return read_options(f.metadata[NESTED], args)
    value = getattr(args, f.name)
    if CLI in f.metadata and f.metadata[CLI].get("nargs") in ("+", "*") and value is not None:
        return tuple(value)  # a repeated value given or its default alike, and the dataclass stays hashable
    return value
