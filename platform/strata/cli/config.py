"""Where the CLI finds the control plane: flags, then STRATA_URL/STRATA_TOKEN, then a config file."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


class ConfigError(Exception):
    pass


def config_path() -> Path:
    return Path(os.environ.get("STRATA_CONFIG") or Path.home() / ".config" / "strata" / "config.yaml").expanduser()


def client_settings(url: str | None = None, token: str | None = None) -> tuple[str, str]:
    data = {}
    path = config_path()
    if path.exists():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path} is not valid YAML: {error}") from None
    url = url or os.environ.get("STRATA_URL") or data.get("url")
    token = token or os.environ.get("STRATA_TOKEN") or data.get("token")
    if not url or not token:
        raise ConfigError("no control plane configured: set STRATA_URL and STRATA_TOKEN, or write url: and token: "
                          f"to {path} (strata up prints both)")
    return url, token


def write_client_config(path: Path, url: str, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"url": url, "token": token}))
    path.chmod(0o600)
