"""Typed readers for STRATA_* environment variables (12-factor settings).

Each reader raises ``ImproperlyConfigured`` naming the variable on a bad value. ``NAME_FILE`` may hold the
path of a file whose content is the value, for secrets mounted as files.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as error:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {error}") from error
    return os.environ.get(name)


def env_str(name: str, default: str | None = None) -> str | None:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {value!r}")


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from error
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    return number


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from error
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    return number


def env_float_or_none(name: str, default: float | None, minimum: float | None = None) -> float | None:
    """A number that may be switched off: unset gives ``default``, an empty value None."""
    value = _raw(name)
    if value is not None and not value.strip():
        return None
    return env_float(name, default, minimum) if value is not None else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def strata_home() -> Path:
    """The state directory of embedded deployments: database, broker spool, artifacts, credentials."""
    home = Path(env_str("STRATA_HOME", str(Path.home() / ".strata"))).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home
