"""One app per data directory: a second `sapo-swarm` shows the first one's window and exits.

A `QLockFile` in the data directory decides who runs (a lock left by a crashed app is stale
and taken over); the running app listens on a `QLocalServer` whose name derives from the
data directory, and a second launch connects to it and says "show". Two data directories
(`SAPO_DATA_DIR`) are two nodes, and may run side by side.
"""

from __future__ import annotations

import getpass
import hashlib
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from sapo_core import paths

SHOW = b"show\n"


def instance_key(data_dir: Path) -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment: the data dir alone still separates
        user = ""
    digest = hashlib.sha1(f"{user}:{data_dir.resolve()}".encode()).hexdigest()[:16]
    return f"sapo-swarm-{digest}"


class SingleInstance(QObject):
    activated = Signal()
    """Another launch asked this instance to show its window."""

    def __init__(self, data_dir: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.data_dir = data_dir or paths.data_dir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.key = instance_key(self.data_dir)
        self.lock = QLockFile(str(self.data_dir / "sapo-swarm.lock"))
        self.lock.setStaleLockTime(0)  # only a dead owner's lock is stale
        self.server: QLocalServer | None = None

    def acquire(self) -> bool:
        """True: this is the only instance (it now listens). False: another one runs and was asked to show."""
        if not self.lock.tryLock(200):
            self._ask_other_to_show()
            return False
        QLocalServer.removeServer(self.key)  # a crashed instance's socket file
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(self._on_server_new_connection)
        self.server.listen(self.key)
        return True

    def release(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.lock.unlock()

    def _ask_other_to_show(self) -> bool:
        sock = QLocalSocket()
        sock.connectToServer(self.key)
        if not sock.waitForConnected(2000):
            return False
        sock.write(SHOW)
        sock.flush()
        sock.waitForBytesWritten(2000)
        sock.disconnectFromServer()
        return True

    def _on_server_new_connection(self) -> None:
        while self.server is not None and self.server.hasPendingConnections():
            conn = self.server.nextPendingConnection()
            conn.readyRead.connect(lambda c=conn: self._on_conn_ready_read(c))
            if conn.bytesAvailable():
                self._on_conn_ready_read(conn)

    def _on_conn_ready_read(self, conn: QLocalSocket) -> None:
        if bytes(conn.readAll()).startswith(SHOW.strip()):
            self.activated.emit()
        conn.disconnectFromServer()


__all__ = ["SingleInstance", "instance_key"]
