"""`sapo-node doctor`'s display check, also run by the app before Qt starts (app/main.py): which
Qt platform plugin a window here loads, which of the system libraries it needs are missing, and
the Debian package of each."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sapo_core.commands.doctor_probes import Check, ProbeResult


def display_platform(environ: dict[str, str] | None = None) -> str | None:
    """The Qt platform plugin a window in this session loads: wayland, xcb, or None (no display)."""
    env = os.environ if environ is None else environ
    forced = env.get("QT_QPA_PLATFORM", "").split(":")[0]
    if forced:
        return None if forced in ("offscreen", "minimal") else forced
    if env.get("WAYLAND_DISPLAY"):
        return "wayland"
    if env.get("DISPLAY"):
        return "xcb"
    return None


def _soname_package(soname: str) -> str:
    """Debian's package for a shared library: libxcb-icccm.so.4 -> libxcb-icccm4,
    libxkbcommon-x11.so.0 -> libxkbcommon-x11-0 (a dash where the name ends in a digit)."""
    name, _, version = soname.partition(".so.")
    return f"{name}{'-' if name[-1:].isdigit() else ''}{version.split('.')[0]}" if version else name


def missing_platform_libraries(platform: str = "xcb") -> list[str]:
    """Shared libraries Qt's `platform` plugin needs that this system lacks: what `ldd` says is
    not found for the plugin and its Qt support library, and for xcb libxcb-cursor, which Qt
    6.5+ loads at run time. Empty when none is missing (or when this cannot be told)."""
    import ctypes.util
    import importlib.util

    spec = importlib.util.find_spec("PySide6")  # where it is, without importing Qt into the engine
    if spec is None or not spec.submodule_search_locations:
        return []
    qt = Path(next(iter(spec.submodule_search_locations))) / "Qt"
    plugin = qt / "plugins" / "platforms" / f"libq{platform}.so"
    files = [plugin, *sorted((qt / "lib").glob("libQt6XcbQpa.so*" if platform == "xcb" else "libQt6WaylandClient.so*"))]
    missing: list[str] = []
    for f in files[:2]:
        if not f.is_file() or shutil.which("ldd") is None:
            continue
        try:
            out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        missing += [line.split()[0] for line in out.splitlines() if "=> not found" in line]
    if platform == "xcb" and ctypes.util.find_library("xcb-cursor") is None:
        missing.append("libxcb-cursor.so.0")
    return list(dict.fromkeys(missing))


def judge_display(platform: str | None, result: ProbeResult | None, missing: list[str]) -> Check:
    """Whether the window can open on this session's display."""
    if platform is None:
        return Check("display", "ok", "no display in this session: the app needs one (or runs --headless)")
    packages = " ".join(_soname_package(m) for m in missing)
    fix = (
        f"install what Qt's {platform} plugin needs: sudo apt install {packages} (Debian/Ubuntu names; "
        "Fedora: the same libraries from dnf), then rerun the doctor"
        if missing
        else "see the error above; QT_QPA_PLATFORM=offscreen only hides it (headless: sapo-swarm --headless)"
    )
    why = result.failure() if result is not None else None
    if why or missing:
        lacking = f"; missing {', '.join(missing)}" if missing else ""
        return Check(
            "display",
            "warn",
            f"the window cannot open on this display (Qt {platform}){lacking}" + (f": {why}" if why else ""),
            fix,
            result.seconds if result is not None else 0.0,
        )
    p = (result.payload if result is not None else None) or {}
    return Check("display", "ok", f"Qt opens a window here ({p.get('platform', platform)})", seconds=result.seconds)
