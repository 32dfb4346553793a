"""Where the app keeps what it remembers.

- The node's settings: the TOML config at `paths.data_dir()/node.toml`, the same file
  `sapo-node run` reads, written atomically with `save_config`.
- The UI's own settings (window geometry, tab, dashboard window, whether the user left the
  node paused): `QSettings` in an INI file beside it (`ui.ini`), so a portable install or a
  test's `SAPO_DATA_DIR` keeps everything in one folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings

from sapo_core import paths
from sapo_core.config import ConfigError, NodeConfig, from_dict, load_config, save_config, to_dict

NODE_CONFIG_NAME = "node.toml"
UI_SETTINGS_NAME = "ui.ini"


def node_config_path() -> Path:
    return paths.data_dir() / NODE_CONFIG_NAME


def has_node_config() -> bool:
    """A config exists: the first-run wizard has been through (or the user wrote one)."""
    return node_config_path().is_file()


def load_node_config() -> NodeConfig:
    """The saved config with its run directory filled in, as `sapo-node run` builds it.

    Raises ConfigError naming the key when the file is broken."""
    cfg = load_config(node_config_path())
    return with_run_dir(cfg)


def with_run_dir(cfg: NodeConfig) -> NodeConfig:
    if cfg.run_dir:
        return cfg
    return from_dict({**to_dict(cfg), "run_dir": str(paths.default_run_dir())})


def save_node_config(cfg: NodeConfig) -> Path:
    path = node_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_config(cfg, path)
    return path


class UiSettings:
    """Typed access to the UI's QSettings; every value has a default."""

    DEFAULTS: dict[str, Any] = {
        "window/geometry": QByteArray(),
        "window/tab": 0,
        "dashboard/window": 20,  # rounds in the rolling mean
        "node/paused_by_user": False,
        "tray/told_about_close": False,
        "export/dir": "",
        "updates/url": "",  # the signed release manifest (app/updater.py); none shipped yet
        "updates/automatic": False,  # install by itself, between rounds
        "updates/told": "",  # the release the tray last told of
    }

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or paths.data_dir() / UI_SETTINGS_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.qsettings = QSettings(str(self.path), QSettings.Format.IniFormat)

    def get(self, key: str) -> Any:
        default = self.DEFAULTS[key]
        value = self.qsettings.value(key, default)
        if isinstance(default, bool):  # INI files give back strings
            return value in (True, "true", "True", "1", 1)
        if isinstance(default, int):
            try:
                return int(value)
            except (TypeError, ValueError):
                return default
        return value

    def set(self, key: str, value: Any) -> None:
        if key not in self.DEFAULTS:
            raise KeyError(f"unknown UI setting {key!r}")
        self.qsettings.setValue(key, value)

    def sync(self) -> None:
        self.qsettings.sync()


__all__ = [
    "UiSettings",
    "node_config_path",
    "has_node_config",
    "load_node_config",
    "save_node_config",
    "with_run_dir",
    "ConfigError",
    "NODE_CONFIG_NAME",
]
