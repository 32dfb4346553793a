"""What the rules read from the operating system, through one boundary: `SystemProbe.read()`.

Battery (psutil), seconds since the user's last input (X11 screensaver extension or
`xprintidle`, GNOME's idle monitor on Wayland, macOS `ioreg HIDIdleTime`, Windows
`GetLastInputInfo`), CPU use by other programs (the fallback where the OS does not tell
input idle time), the hottest CPU temperature where sensors exist, free memory, the local
clock. A value the OS does not give is None and its rule does not act.

Tests replace the boundary and nothing else: in-process by passing another `read`
callable to the rules, across processes with `SAPO_FAKE_SYSTEM=<file.json>`, a JSON object
whose keys (`on_battery`, `battery_percent`, `idle_seconds`, `other_cpu_percent`,
`temperature_c`, `free_memory_bytes`, `now` as ISO time) replace the real readings; the file
is re-read at every check, so a test changes the machine's state by rewriting it.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import psutil

from sapo_core.cpu import busy_seconds, tree_cpu_seconds

FAKE_ENV = "SAPO_FAKE_SYSTEM"


@dataclass(frozen=True)
class SystemReading:
    now: datetime  # local wall clock
    on_battery: bool | None  # None: no battery, or the OS does not say
    battery_percent: float | None
    idle_seconds: float | None  # since the last keyboard/mouse input; None where the OS does not tell
    other_cpu_percent: float | None  # CPU use of everything but the node, % of the whole machine
    temperature_c: float | None  # hottest CPU sensor
    free_memory_bytes: int | None


class SystemProbe:
    """Reads the real machine. `read()` is the one boundary the rules use."""

    def __init__(self, own_pid: int | None = None) -> None:
        self._own = psutil.Process(own_pid or os.getpid())
        self._idle_reader = _find_idle_reader()
        self._last_cpu: tuple[float, float, float] | None = None  # (wall, system busy s, own s)

    def read(self) -> SystemReading:
        plugged, percent = _battery()
        return SystemReading(
            now=datetime.now(),
            on_battery=plugged,
            battery_percent=percent,
            idle_seconds=self._idle_seconds(),
            other_cpu_percent=self._other_cpu(),
            temperature_c=_temperature(),
            free_memory_bytes=psutil.virtual_memory().available,
        )

    def _idle_seconds(self) -> float | None:
        if self._idle_reader is None:
            return None
        try:
            return self._idle_reader()
        except Exception:  # a display that went away: fall back to CPU use from now on
            self._idle_reader = None
            return None

    def _other_cpu(self) -> float | None:
        """CPU use of other programs since the previous call (None on the first)."""
        busy, own = busy_seconds(), tree_cpu_seconds(self._own)
        now = time.monotonic()
        last, self._last_cpu = self._last_cpu, (now, busy, own)
        if last is None or now - last[0] < 0.2:
            return None
        capacity = (now - last[0]) * (psutil.cpu_count() or 1)
        return max(0.0, min(100.0, 100.0 * ((busy - last[1]) - (own - last[2])) / capacity))


class FakeFileProbe:
    """The real probe with readings replaced by the JSON file named in SAPO_FAKE_SYSTEM."""

    def __init__(self, path: Path, real: SystemProbe | None = None) -> None:
        self.path, self.real = Path(path), real or SystemProbe()

    def read(self) -> SystemReading:
        reading = self.real.read()
        try:
            fake = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return reading  # being rewritten: the next check reads it
        if "now" in fake:
            fake["now"] = datetime.fromisoformat(fake["now"])
        known = set(SystemReading.__dataclass_fields__)
        return replace(reading, **{k: v for k, v in fake.items() if k in known})


def probe_from_env() -> SystemProbe | FakeFileProbe:
    path = os.environ.get(FAKE_ENV)
    return FakeFileProbe(Path(path)) if path else SystemProbe()


# --- the readings, one small function each ------------------------------------------------------


def _battery() -> tuple[bool | None, float | None]:
    try:
        b = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):
        return None, None
    if b is None:
        return None, None
    return (None if b.power_plugged is None else not b.power_plugged), float(b.percent)


def _temperature() -> float | None:
    try:
        sensors = psutil.sensors_temperatures()
    except (AttributeError, NotImplementedError, OSError):
        return None  # macOS and Windows: psutil has no sensors there
    preferred = [
        k
        for k in sensors
        if k in ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz", "soc_thermal")
    ]
    values = [t.current for k in (preferred or list(sensors)) for t in sensors[k] if t.current and t.current > 0]
    return max(values) if values else None


def _find_idle_reader():
    """A function returning seconds since the last input, or None where this OS gives none."""
    if sys.platform == "win32":
        return _windows_idle
    if sys.platform == "darwin":
        return _macos_idle if shutil.which("ioreg") else None
    readers = []
    if os.environ.get("DISPLAY"):
        readers += [_x11_idle_ctypes(), _xprintidle if shutil.which("xprintidle") else None]
    if os.environ.get("WAYLAND_DISPLAY") and shutil.which("gdbus"):
        readers.append(_gnome_idle)
    for reader in readers:
        if reader is None:
            continue
        try:
            reader()
            return reader
        except Exception:
            continue
    return None


def _windows_idle() -> float:
    class LASTINPUTINFO(ctypes.Structure):
        _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint)]

    info = LASTINPUTINFO(ctypes.sizeof(LASTINPUTINFO), 0)
    if not ctypes.windll.user32.GetLastInputInfo(ctypes.byref(info)):  # type: ignore[attr-defined]
        raise OSError("GetLastInputInfo failed")
    return ((ctypes.windll.kernel32.GetTickCount() - info.dwTime) & 0xFFFFFFFF) / 1000.0  # type: ignore[attr-defined]


def _macos_idle() -> float:
    out = subprocess.run(["ioreg", "-c", "IOHIDSystem", "-d", "4"], capture_output=True, text=True, timeout=5).stdout
    for line in out.splitlines():
        if "HIDIdleTime" in line:
            return int(line.rsplit("=", 1)[1].strip()) / 1e9
    raise OSError("ioreg shows no HIDIdleTime")


def _xprintidle() -> float:
    out = subprocess.run(["xprintidle"], capture_output=True, text=True, timeout=5, check=True).stdout
    return int(out.strip()) / 1000.0


def _gnome_idle() -> float:
    out = subprocess.run(
        [
            "gdbus",
            "call",
            "--session",
            "--dest",
            "org.gnome.Mutter.IdleMonitor",
            "--object-path",
            "/org/gnome/Mutter/IdleMonitor/Core",
            "--method",
            "org.gnome.Mutter.IdleMonitor.GetIdletime",
        ],
        capture_output=True,
        text=True,
        timeout=5,
        check=True,
    ).stdout
    return int(out.strip("()\n ,").split()[-1].rstrip(",")) / 1000.0  # "(uint64 1234,)"


def _x11_idle_ctypes():
    """XScreenSaverQueryInfo through ctypes (libX11 + libXss), or None where they are missing."""
    import ctypes.util

    names = ctypes.util.find_library("X11"), ctypes.util.find_library("Xss")
    if not all(names):
        return None

    class XScreenSaverInfo(ctypes.Structure):
        _fields_ = [
            ("window", ctypes.c_ulong),
            ("state", ctypes.c_int),
            ("kind", ctypes.c_int),
            ("til_or_since", ctypes.c_ulong),
            ("idle", ctypes.c_ulong),
            ("eventMask", ctypes.c_ulong),
        ]

    x11, xss = ctypes.cdll.LoadLibrary(names[0]), ctypes.cdll.LoadLibrary(names[1])
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
    x11.XDefaultRootWindow.restype = ctypes.c_ulong
    xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(XScreenSaverInfo)
    xss.XScreenSaverQueryInfo.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.POINTER(XScreenSaverInfo)]
    display = x11.XOpenDisplay(None)
    if not display:
        return None
    info = xss.XScreenSaverAllocInfo()

    def read() -> float:
        if not xss.XScreenSaverQueryInfo(display, x11.XDefaultRootWindow(display), info):
            raise OSError("XScreenSaverQueryInfo failed")
        return info.contents.idle / 1000.0

    return read


__all__ = ["SystemReading", "SystemProbe", "FakeFileProbe", "probe_from_env", "FAKE_ENV"]
