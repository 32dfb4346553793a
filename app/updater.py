"""Updates in the app: the update repository checked in the background, a bar in the window that
says what is new, and an install that waits for the node's round (sapo_core/updates.py, on TUF).

- `Updater` checks the repository at `updates/url` (Settings tab; none is shipped until the
  project signs releases) a minute after start and then daily, on a thread; it never downloads
  on a metered connection (Qt's QNetworkInformation, where the system says so).
- `UpdateBar` says "SAPO Swarm X is available" with the release's notes, and offers "Update now"
  where this copy can be updated in place (a package install), else what to run instead. When
  the repository's signed metadata has expired (a frozen mirror, or someone holding news of
  releases back), it says this copy cannot confirm it is up to date, and why.
- The window's update flow (update_flow.py) installs only when asked, or by itself when
  `updates/automatic` is on: it asks the node to pause after its round (the round's checkpoint
  is written), stops it, downloads and installs, and says to restart. A failed download or
  install leaves the installed version, and the node is started again.
"""

from __future__ import annotations

import html
import ssl
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QWidget,
)

from sapo_core import __version__, paths, updates

FIRST_CHECK_MS = 60_000
CHECK_EVERY_MS = 24 * 3600 * 1000


def metered() -> bool:
    """The system says the connection is metered (False where it cannot say)."""
    from PySide6.QtNetwork import QNetworkInformation

    try:
        if QNetworkInformation.instance() is None:
            QNetworkInformation.loadBackendByFeatures(QNetworkInformation.Feature.Metered)
        info = QNetworkInformation.instance()
        return bool(info is not None and info.supports(QNetworkInformation.Feature.Metered) and info.isMetered())
    except (RuntimeError, AttributeError):
        return False


class Updater(QObject):
    found = Signal(object)
    """updates.Release: a newer release than this one (emitted once per check that finds one)."""
    checked = Signal(str)
    """A line for the log: what the check found or why it found nothing."""
    unconfirmed = Signal(str)
    """Why this copy cannot confirm it is up to date: the repository's signed metadata expired."""
    progress = Signal(int, int)
    """(bytes, of bytes) of the package being downloaded."""
    done = Signal(bool, str)
    """(installed, what to tell the user) at the end of a download and install."""

    def __init__(
        self,
        settings,
        parent: QObject | None = None,
        where: updates.Installation | None = None,
        context: ssl.SSLContext | None = None,
        root: bytes | None = None,
        metadata: Path | None = None,
    ) -> None:
        """`where`, `context`, `root`, `metadata`: this copy's installation, the TLS context, the
        trusted root and the folder of trusted metadata (tests give their own; by default:
        detected, the system's, the shipped root, the data directory's)."""
        super().__init__(parent)
        self.settings = settings
        self.where = where or updates.installation()
        self.context, self.root, self.metadata = context, root, metadata
        self.release: updates.Release | None = None
        self.checking = self.installing = False  # a check, a download and install, under way
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self._on_timer_timeout)

    def schedule(self, first_ms: int = FIRST_CHECK_MS) -> None:
        self._timer.start(first_ms)

    def _on_timer_timeout(self) -> None:
        self.check_now()
        self._timer.start(CHECK_EVERY_MS)

    def package(self) -> updates.Package | None:
        """The package for this installation of the release found, if it can install one."""
        if self.release is None or self.where.kind in ("source", "unpacked"):
            return None
        return self.release.packages.get(self.where.platform)

    def check_now(self) -> bool:
        """Start a check on a thread; False if there is no URL or one is under way."""
        url = str(self.settings.get("updates/url") or "").strip()
        if not url or self.checking:
            return False
        self.checking = True
        threading.Thread(target=self._check, args=(url,), name="update-check", daemon=True).start()
        return True

    def _check(self, url: str) -> None:
        try:
            got = updates.check([url], self.root, self.metadata, timeout=10.0, context=self.context)
        except Exception as e:  # noqa: BLE001 (a check never takes the app down)
            got = None
            self.checked.emit(f"update check failed: {e}")
        finally:
            self.checking = False
        if got is None:
            return
        for message in got.refused:
            if not got.unconfirmed or got.unconfirmed not in message:
                self.checked.emit(f"update check: {message}")
        if got.unconfirmed:
            self.unconfirmed.emit(got.unconfirmed)
            return
        newer = got.newer()
        if newer is None:
            have = got.release.version if got.release else "none"
            self.checked.emit(f"no newer release (this is {__version__}; the repository names {have})")
            return
        self.release = newer
        self.checked.emit(f"SAPO Swarm {newer.version} is available (this is {__version__})")
        self.found.emit(newer)

    def install_now(self) -> bool:
        """Download and install the release found, on a thread. False if one is under way (it
        will say `done`), or if this one cannot start: nothing to install here, or a metered
        connection (then `done` says why at once)."""
        if self.installing:
            return False
        release, package = self.release, self.package()
        if release is None or package is None:
            self.done.emit(False, "There is no package of the release found for this copy.")
            return False
        if metered():
            self.done.emit(False, "The connection is metered: the update waits for another one.")
            return False
        self.installing = True
        threading.Thread(target=self._install, args=(release, package), name="update-install", daemon=True).start()
        return True

    def _install(self, release: updates.Release, package: updates.Package) -> None:
        try:
            folder, progress = paths.cache_dir() / "updates", self._progress
            file = updates.download(package, folder, self.root, self.metadata, context=self.context, progress=progress)
            said = updates.install(file, release, self.where)
            ok = True
        except updates.UpdateError as e:
            said, ok = str(e), False
        except Exception as e:  # noqa: BLE001 (whatever broke, the installed version stays)
            said, ok = f"the update failed ({e}); the installed version stays", False
        self.installing = False
        self.done.emit(ok, said[:1].upper() + said[1:] + ("." if not said.endswith(".") else ""))

    def _progress(self, got: int, total: int) -> None:
        self.progress.emit(got, total)

    def launcher(self) -> Path | None:
        """What starts the installed version (a tarball's `current/sapo-swarm`), if known."""
        if self.where.kind == "tarball" and self.where.root is not None:
            return self.where.root / "current" / updates.LAUNCHER
        return None


class UpdateBar(QFrame):
    update_requested = Signal()
    restart_requested = Signal()
    check_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("updateBar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        self.label = QLabel(wordWrap=True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.bar = QProgressBar(visible=False, maximumWidth=160)
        self.update_button = QPushButton("Update now")
        self.update_button.setToolTip(
            "Waits for the node's round to end, then installs; training goes on after a restart"
        )
        self.restart_button = QPushButton("Restart now", visible=False)
        self.check_button = QPushButton("Check again", visible=False)
        self.later_button = QPushButton("Later")
        row.addWidget(self.label, 1)
        row.addWidget(self.bar)
        for b in (self.update_button, self.restart_button, self.check_button, self.later_button):
            row.addWidget(b)
        self.update_button.clicked.connect(self.update_requested)
        self.restart_button.clicked.connect(self.restart_requested)
        self.check_button.clicked.connect(self.check_requested)
        self.later_button.clicked.connect(self.hide)
        self.hide()

    def offer(self, release: updates.Release, installable: bool) -> None:
        notes = f" {html.escape(release.notes)}" if release.notes else ""
        how = (
            ""
            if installable
            else " This copy runs from its source folder: there, run <code>git pull &amp;&amp; "
            "./installer/install.sh</code>."
        )
        self.label.setText(
            f"<b>SAPO Swarm {html.escape(release.version)} is available</b> (this is {__version__}).{notes}{how}"
        )
        self.update_button.setVisible(installable)
        self.update_button.setEnabled(True)
        self.update_button.setText("Update now")
        self.restart_button.hide()
        self.check_button.hide()
        self.bar.hide()
        self.show()

    def unconfirmed(self, why: str) -> None:
        """The repository's metadata expired: no release can be believed, so none is offered."""
        self.label.setText(
            f"<b>SAPO Swarm cannot confirm it is up to date.</b> {html.escape(why[:1].upper() + why[1:])}. "
            "This version keeps running; the app checks again tomorrow."
        )
        for b in (self.update_button, self.restart_button, self.bar):
            b.hide()
        self.check_button.show()
        self.show()

    def waiting(self, text: str) -> None:
        self.label.setText(html.escape(text))
        self.update_button.setEnabled(False)
        self.check_button.hide()
        self.show()

    def downloading(self, got: int, total: int) -> None:
        self.bar.setVisible(True)
        self.bar.setRange(0, max(1, total))
        self.bar.setValue(got)

    def finished(self, ok: bool, text: str, can_restart: bool) -> None:
        self.bar.hide()
        self.label.setText(html.escape(text))
        self.update_button.setVisible(not ok)
        self.update_button.setEnabled(True)
        self.update_button.setText("Try again")
        self.restart_button.setVisible(ok and can_restart)
        self.check_button.hide()
        self.show()


class UpdateSettings(QGroupBox):
    """The Settings tab's group: where releases are announced, and whether to install by itself."""

    check_requested = Signal()

    def __init__(self, settings, parent: QWidget | None = None) -> None:
        super().__init__("Updates", parent)
        self.settings = settings
        form = QFormLayout(self)
        self.url_edit = QLineEdit(
            str(settings.get("updates/url") or ""),
            placeholderText="https://… (the project's update repository; none is set yet)",
        )
        self.url_edit.setAccessibleName("Update repository URL")
        self.url_edit.editingFinished.connect(self._on_url_edit_editing_finished)
        self.auto_box = QCheckBox("Install updates by themselves (between rounds, never on a metered connection)")
        self.auto_box.setChecked(bool(settings.get("updates/automatic")))
        self.auto_box.toggled.connect(self._on_auto_box_toggled)
        self.check_button = QPushButton("Check now")
        self.check_button.clicked.connect(self.check_requested)
        self.status_label = QLabel(wordWrap=True)
        row = QHBoxLayout()
        row.addWidget(self.url_edit, 1)
        row.addWidget(self.check_button)
        form.addRow("Releases from:", row)
        form.addRow(self.auto_box)
        form.addRow(self.status_label)

    def _on_url_edit_editing_finished(self) -> None:
        url = self.url_edit.text().strip()
        if url and not url.startswith("https://"):
            self.status_label.setText("Only an https:// address is used.")
            return
        self.settings.set("updates/url", url)
        self.status_label.setText("")

    def _on_auto_box_toggled(self, on: bool) -> None:
        self.settings.set("updates/automatic", on)


__all__ = ["UpdateBar", "UpdateSettings", "Updater", "metered"]
