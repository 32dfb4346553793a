"""How the node's config dataclasses are declared, checked and read; `sapo_core.config` holds them.

A field is declared with `setting(help, default)` (its help string in the field's metadata) and
checked in `__post_init__` with `check(cond, "table.key", "what to change")`, which raises
`ConfigError`. `build` turns a nested dict (a parsed TOML file) into the nested dataclasses,
naming unknown keys and wrong types by their dotted name; `merge` and `undot` apply changes to
such a dict. Nothing here knows the config's tables, so the concern modules (`config`,
`config_swarm`) import this one and never each other in a circle.

Standard library only, like `sapo_core.config`: the GUI and the control protocol use it without torch.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config value is wrong; the message names the key and what to change."""


def setting(text: str, default: Any) -> Any:
    """A dataclass field with a default (a fresh copy where it is a list or dict) and a help string."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": text})
    return field(default=default, metadata={"help": text})


def check(cond: bool, key: str, msg: str) -> None:
    """Raise ConfigError naming the dotted key unless cond holds."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def undot(changes: Mapping[str, Any]) -> dict:
    """{"train.learning_rate": x} -> {"train": {"learning_rate": x}}."""
    out: dict = {}
    for key, value in changes.items():
        parts = key.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = value
    return out


def merge(base: dict, over: Mapping[str, Any]) -> dict:
    """base with over's values, tables merged key by key."""
    out = dict(base)
    for k, v in over.items():
        # A task-weight table replaces the default mix instead of adding to it.
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and k != "weights":
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp) or tp
    if origin in (int,) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if origin is bool and isinstance(value, bool):
        return value
    if origin is str and isinstance(value, str):
        return value
    if origin is list and isinstance(value, (list, tuple)):
        return list(value)
    if origin is dict and isinstance(value, Mapping):
        return dict(value)
    raise ConfigError(f"{key}: expected {getattr(origin, '__name__', origin)}, got {value!r}")


def build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """The dataclass cls (nested ones from nested tables) from data; missing keys take their defaults."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = prefix.rstrip(".") or "the top level"
        raise ConfigError(
            f"unknown key(s) {', '.join(prefix + u for u in unknown)} in {where}; known: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{name}: expected a table, got {value!r}")
            kwargs[name] = build(tp, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, tp, prefix + name)
    return cls(**kwargs)


def read_toml(path: str | os.PathLike) -> dict:
    """A TOML file's tables; a missing file is an error (say which), a broken one names the line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
