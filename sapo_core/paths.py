"""Where the node keeps its files: the data directory (runs, model cache, identity).

`SAPO_DATA_DIR` overrides the platform's user data directory (tests, portable installs),
`SAPO_CACHE_DIR` the cache inside it.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    env = os.environ.get("SAPO_DATA_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("sapo-swarm", appauthor=False))


def cache_dir() -> Path:
    """Converted models, re-quantized GGUFs, downloads: safe to delete, rebuilt on demand.

    `SAPO_CACHE_DIR` moves it (tests share one cache across temporary data directories)."""
    return Path(os.environ["SAPO_CACHE_DIR"]).expanduser() if os.environ.get("SAPO_CACHE_DIR") else data_dir() / "cache"


def converted_models_dir() -> Path:
    """GGUFs de-quantized for training (policy.py's cache): the node, eval, export and the doctor's
    training check read and fill this one, so the check an install runs spares a first start."""
    return cache_dir() / "hf"


def default_run_dir() -> Path:
    return data_dir() / "runs" / "default"


def identity_dir() -> Path:
    return data_dir() / "identity"


def keep_matplotlib_cache_in_ours() -> None:
    """reasoning-gym imports matplotlib, which writes a font cache into ~/.cache and ~/.config;
    point it into our cache so an uninstall leaves nothing behind (call before that import)."""
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
