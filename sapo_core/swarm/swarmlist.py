"""The list of named swarms: resources/swarms.toml (shipped) plus swarms.toml in the data
directory (the user's own), read by the node (`swarm.listed_swarm`, `sapo-node run --swarm`)
and the setup wizard.

An entry fixes what every node of a swarm must share (its name, the DHT window, the shard count,
the task mix) and names bootstrap peers. `apply_swarm` is a pure function from (config, entry)
to the config a node runs with. There are no public bootstrap servers for this project: the
shipped list holds an example with an empty bootstrap list, and says so.

Standard library only (the GUI imports it).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_core.config import PAPER_SPECIALTIES, ConfigError, NodeConfig, SwarmConfig

USER_FILE_NAME = "swarms.toml"
MAX_BOOTSTRAP = 16


class SwarmListError(ValueError):
    """A swarm list entry is wrong; the message names the file, the entry and what to change."""


@dataclass(frozen=True)
class SwarmEntry:
    name: str
    description: str = ""
    bootstrap: list[str] = field(default_factory=list)
    window_seconds: float = 300.0
    shards: int = 16
    tasks: dict[str, float] = field(default_factory=dict)  # empty: the node's default mix
    source: str = ""  # the file it came from ("" for invitations)
    page: str = ""  # the swarm's page (a seed's, swarm/page.py): an http(s) URL, "" for none

    def __post_init__(self) -> None:
        # SwarmConfig's own checks say what is wrong with a name, a peer, a window or shards
        try:
            SwarmConfig(
                swarm_name=self.name,
                initial_peers=list(self.bootstrap),
                window_seconds=self.window_seconds,
                shards=self.shards,
                shards_read=1,
            )
        except ConfigError as e:
            raise SwarmListError(
                str(e)
                .replace("swarm.swarm_name", "name")
                .replace("swarm.initial_peers", "bootstrap")
                .replace("swarm.", "")
            ) from None
        if len(self.bootstrap) > MAX_BOOTSTRAP:
            raise SwarmListError(f"bootstrap: at most {MAX_BOOTSTRAP} peers")
        if len(self.description) > 500:
            raise SwarmListError("description: at most 500 characters")
        if self.page and not (
            self.page.startswith(("https://", "http://"))
            and len(self.page) <= 200
            and all(c.isprintable() and not c.isspace() and c not in "<>\"'" for c in self.page)
        ):
            raise SwarmListError("page: an http:// or https:// address of at most 200 characters")
        for task, weight in self.tasks.items():
            if task not in PAPER_SPECIALTIES:
                raise SwarmListError(f"tasks.{task}: unknown task; known: {', '.join(PAPER_SPECIALTIES)}")
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 <= weight <= 100:
                raise SwarmListError(f"tasks.{task}: weight must be a number 0..100")

    def to_toml_table(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "bootstrap": list(self.bootstrap),
            "window_seconds": float(self.window_seconds),
            "shards": int(self.shards),
        }
        if self.page:
            out["page"] = self.page
        if self.tasks:
            out["tasks"] = {k: float(v) for k, v in self.tasks.items()}
        return out


def _entry(table: Any, where: str) -> SwarmEntry:
    if not isinstance(table, Mapping):
        raise SwarmListError(f"{where}: each [[swarm]] must be a table")
    known = {"name", "description", "bootstrap", "window_seconds", "shards", "tasks", "page"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise SwarmListError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return SwarmEntry(
            name=str(table.get("name", "")),
            description=str(table.get("description", "")),
            bootstrap=[str(p) for p in table.get("bootstrap", [])],
            window_seconds=float(table.get("window_seconds", 300.0)),
            shards=int(table.get("shards", 16)),
            tasks=dict(table.get("tasks", {})),
            source=where.split(":")[0],
            page=str(table.get("page", "")),
        )
    except (TypeError, ValueError) as e:
        raise SwarmListError(f"{where}: {e}") from None


def parse_swarms(text: str, source: str) -> list[SwarmEntry]:
    """The entries of one swarms.toml; SwarmListError naming the entry if one is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SwarmListError(f"{source} is not valid TOML: {e}") from None
    tables = data.get("swarm", [])
    if not isinstance(tables, list):
        raise SwarmListError(f"{source}: write each swarm as a [[swarm]] table")
    return [
        _entry(t, f"{source}: swarm {i + 1} ({t.get('name', '?') if isinstance(t, Mapping) else '?'})")
        for i, t in enumerate(tables)
    ]


def user_swarms_path() -> Path:
    from sapo_core import paths

    return paths.data_dir() / USER_FILE_NAME


def shipped_swarms_text() -> str:
    """resources/swarms.toml: from this source tree when there is one, else the installed package."""
    beside = Path(__file__).resolve().parents[2] / "resources" / "swarms.toml"
    if beside.is_file():
        return beside.read_text(encoding="utf-8")
    from importlib import resources

    return resources.files("sapo_resources").joinpath("swarms.toml").read_text(encoding="utf-8")


def load_swarms(user_path: Path | None = None, signed_path: Path | None = None) -> list[SwarmEntry]:
    """The shipped swarms, then the last signed list fetched (signedlist.py), then the user's:
    a later entry with an earlier one's name replaces it."""
    from sapo_core.swarm.signedlist import load_last_good

    entries = {e.name: e for e in parse_swarms(shipped_swarms_text(), "resources/swarms.toml")}
    signed = load_last_good(signed_path, check=parse_swarms)
    if signed is not None:
        entries.update({e.name: e for e in signed.entries})
    path = user_swarms_path() if user_path is None else user_path
    if path.is_file():
        entries.update({e.name: e for e in parse_swarms(path.read_text(encoding="utf-8"), str(path))})
    return list(entries.values())


def find_swarm(name: str, user_path: Path | None = None) -> SwarmEntry:
    entries = load_swarms(user_path)
    for e in entries:
        if e.name == name:
            return e
    raise SwarmListError(
        f"no listed swarm is called '{name}'; listed: {', '.join(e.name for e in entries) or 'none'}"
        f" (add one to {user_swarms_path() if user_path is None else user_path})"
    )


def page_url(cfg: NodeConfig, entries: list[SwarmEntry] | None = None) -> str:
    """The page of the swarm this config joins: its listed entry's, else the node's own page
    (swarm.page_port), else "" (a swarm without a page: on one network, by invitation)."""
    if not cfg.swarm.enabled:
        return ""
    if cfg.swarm.listed_swarm:
        try:
            listed = load_swarms() if entries is None else entries
        except (SwarmListError, OSError, ValueError):
            listed = []
        for e in listed:
            if e.name == cfg.swarm.listed_swarm and e.page:
                return e.page
    if cfg.swarm.page_port:
        host = cfg.swarm.page_host if cfg.swarm.page_host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{f'[{host}]' if ':' in host else host}:{cfg.swarm.page_port}/"
    return ""


def add_user_swarm(entry: SwarmEntry, user_path: Path | None = None) -> Path:
    """Add (or replace, by name) an entry in the user's swarms.toml; written atomically."""
    import tomli_w

    from sapo_core.fsutil import atomic_write_bytes

    path = user_swarms_path() if user_path is None else user_path
    existing = parse_swarms(path.read_text(encoding="utf-8"), str(path)) if path.is_file() else []
    kept = [e for e in existing if e.name != entry.name] + [entry]
    header = "# Your own swarms; the same layout as SAPO Swarm's resources/swarms.toml.\n"
    body = tomli_w.dumps({"swarm": [e.to_toml_table() for e in kept]})
    atomic_write_bytes(path, (header + body).encode("utf-8"))
    return path


def update_swarm_list(urls: list[str], *args: Any, **kwargs: Any):
    """Fetch the signed swarm list (signedlist.update: keys, path, timeout, context), accepting
    only one that parses as a swarm list; returns signedlist.UpdateResult."""
    from sapo_core.swarm.signedlist import update

    return update(urls, *args, check=parse_swarms, **kwargs)


def sign_swarm_list(text: str, private_key) -> str:
    """A maintainer's list, checked as a swarm list, then signed (signedlist.sign_list)."""
    from sapo_core.swarm.signedlist import sign_list

    parse_swarms(text, "the list to sign")
    return sign_list(text, private_key)


def apply_swarm(cfg: NodeConfig, entry: SwarmEntry, extra_peers: list[str] | None = None) -> NodeConfig:
    """The config a node of `entry` runs with: its name, window, shards, task mix and peers
    (the entry's bootstrap list, then `extra_peers`, without repeats); the rest of `cfg` kept."""
    peers = list(dict.fromkeys([*entry.bootstrap, *(extra_peers or [])]))
    changes: dict[str, Any] = {
        "swarm.enabled": True,
        "swarm.swarm_name": entry.name,
        "swarm.window_seconds": float(entry.window_seconds),
        "swarm.shards": int(entry.shards),
        "swarm.shards_read": min(cfg.swarm.shards_read, int(entry.shards)),
        "swarm.initial_peers": peers,
    }
    if entry.source:
        changes["swarm.listed_swarm"] = entry.name
    if entry.tasks:
        changes["tasks.weights"] = dict(entry.tasks)
    return cfg.replace(**changes)


__all__ = [
    "SwarmEntry",
    "SwarmListError",
    "parse_swarms",
    "load_swarms",
    "find_swarm",
    "add_user_swarm",
    "apply_swarm",
    "user_swarms_path",
    "update_swarm_list",
    "sign_swarm_list",
    "USER_FILE_NAME",
]
