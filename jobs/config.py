"""YAML job configs with `a.b=c` command-line overrides, validated before anything starts.

Every section is a pydantic model with `extra="forbid"`, so an unknown key is an error that
names its full dotted path; override values are parsed as YAML (`x=3`, `x=[a, b]`, `x=null`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ConfigT = TypeVar("ConfigT", bound=BaseModel)


class ConfigError(ValueError):
    """A config that cannot run; the message names each offending key."""


def apply_override(data: dict[str, Any], override: str) -> None:
    """Set `a.b.c=value` in a nested dict, creating sections as needed."""
    key, sep, raw = override.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {override!r} is not of the form key.sub=value")
    *parents, leaf = key.split(".")
    node = data
    for i, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parents[:i + 1])} is a value, not a section")
        node = child
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: the value {raw!r} is not valid YAML ({exc})") from None


def _validate(model: type[ConfigT], data: dict[str, Any]) -> ConfigT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def load_config(model: type[ConfigT], path: str | Path | None = None,
                overrides: list[str] | tuple[str, ...] = (),
                transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> ConfigT:
    """Read YAML (optional), apply overrides, validate; raises ConfigError naming the keys.

    `transform` rewrites the file's validated config (as `model_dump(mode="json")`, every default
    filled in) before the overrides apply, so values given on the command line win over it."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        data = loaded or {}
    if transform is not None:
        data = transform(_validate(model, data).model_dump(mode="json"))
    for override in overrides:
        apply_override(data, override)
    return _validate(model, data)


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown key {key!r}")
        elif not err["loc"]:  # a check across sections: its message names the keys (the input is the whole config)
            lines.append(err["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"{key}: {err['msg']} (got {err.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def dump_config(config: BaseModel) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def config_from_cli(model: type[ConfigT], prog: str, description: str, argv: list[str] | None = None) -> ConfigT:
    """`[--config FILE.yaml] [key.sub=value ...] [--dry-run]` of a one-config job: the validated
    config; exits 2 with the keys of a bad config, or 0 once `--dry-run` printed the resolved config."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help=f"YAML file with {model.__name__} fields")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    args = parser.parse_args(argv)
    try:
        config = load_config(model, args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
    if args.dry_run:
        print(dump_config(config))
        raise SystemExit(0)
    return config
