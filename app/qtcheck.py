"""Refuse a Qt binding that corrupts Python's reference counts.

PySide6 6.12.0 on Python 3.11 drops a reference to None on every call of a method that
returns nothing (`label.setText(...)`, `path.addPolygon(...)`): measured here, 1,000 calls
lower `sys.getrefcount(None)` by 999. From Python 3.12 on None is immortal and nothing
happens; on 3.11 the count reaches zero after some minutes of redrawing and the process
dies with "Fatal Python error: none_dealloc". PySide6 6.11.3 does not have the bug. The app
checks once at start-up and says what to install instead of crashing later.
"""

from __future__ import annotations

import sys

CALLS = 200


def binding_problem() -> str:
    """'' if the binding keeps None's reference count, else what is wrong and what to do."""
    import PySide6
    from PySide6.QtCore import QObject

    obj = QObject()
    before = sys.getrefcount(None)
    for _ in range(CALLS):
        obj.setObjectName("sapo")  # returns nothing: must leave None's count alone
    lost = before - sys.getrefcount(None)
    if lost < CALLS // 2:
        return ""
    return (
        f"PySide6 {PySide6.__version__} on Python {sys.version.split()[0]} corrupts reference counts "
        f"(None lost {lost} references in {CALLS} calls) and would crash the app within minutes. "
        f"Install another version: pip install 'PySide6-Essentials<6.12' (or use Python 3.12 or newer)."
    )


__all__ = ["binding_problem"]
