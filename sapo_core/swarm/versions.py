"""Which SAPO Swarm version a peer announces, and what to tell the volunteer about it.

Each index entry may carry its publisher's app version (records.py, `av`). A newer one is
counted (`swarm/peers_newer`) and said once per version, with what to do (the source's
`_note_version`). A version only helps a person decide: nothing a peer claims here changes
what we accept from it. Pure.
"""

from __future__ import annotations


def newer_version(theirs: str, ours: str) -> bool:
    """Whether version `theirs` is later than `ours` (release numbers compared as integers; a
    suffix such as '+local' or '-rc1' is ignored, and anything unparseable is never newer)."""

    def release(v: str) -> tuple[int, ...] | None:
        head = v.split("+", 1)[0].split("-", 1)[0]
        parts = head.split(".")
        return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) and parts else None

    a, b = release(theirs), release(ours)
    return a is not None and b is not None and a > b


def version_notice(theirs: str, ours: str, seen: set[str], limit: int = 16) -> str | None:
    """What to tell the volunteer the first time a peer announces a newer version (`seen` holds
    those told, at most `limit`); None when there is nothing new to say. A version only helps a
    person decide: nothing a peer claims here changes what we accept from it."""
    if not newer_version(theirs, ours) or theirs in seen or len(seen) >= limit:
        return None
    seen.add(theirs)
    return (
        f"runs SAPO Swarm {theirs}, this node {ours}: update when you can (the installer, or the app's "
        "update); this version goes on sharing with it meanwhile"
    )
