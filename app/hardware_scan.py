"""The hardware scan the first-run wizard shows, run as `sapo-node hardware --json`.

Detecting GPUs imports torch (sapo_core.hardware does it inside `detect_hardware`), and the
app must stay light, so the scan runs in a child process (`QProcess`, never blocking the GUI
thread) and its JSON is read into a `HardwareReport` here: plain data the wizard draws.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QProcess, Signal

from sapo_core.catalog import FITS, NO_FIT, SLOW

VERDICT_ORDER = {FITS: 0, SLOW: 1, NO_FIT: 2}
SCAN_TIMEOUT_MS = 120_000


@dataclass(frozen=True)
class ModelOption:
    id: str
    status: str  # fits, slow, doesn't fit
    reason: str
    memory_gb: float  # on the training device's host (RAM)
    gpu_gb: float
    round_seconds: float
    download_gb: float = 0.0
    params: int = 0  # from the catalogue (0: unknown)
    license: str = ""
    downloaded: bool = False  # its GGUF is on this computer already (or ships with the app)

    @property
    def rounds_per_hour(self) -> float:
        return 3600.0 / self.round_seconds if self.round_seconds > 0 else 0.0

    def usefulness(self) -> tuple:
        """Sort key, most useful first: what fits before what is slow before what does not fit; among
        models that fit the largest (it learns most), among the others the fastest."""
        rank = VERDICT_ORDER.get(self.status, 3)
        return (rank, -self.params if rank == 0 else self.round_seconds)

    @property
    def download_size(self) -> str:
        """'350 MB', '1.2 GB'; '' when unknown."""
        if not self.download_gb:
            return ""
        return f"{self.download_gb * 1000:,.0f} MB" if self.download_gb < 1 else f"{self.download_gb:.1f} GB"

    def row(self, recommended: str) -> list[str]:
        """Its line in the setup's table: model (★ when `recommended`), verdict, parameters, download,
        rounds per hour, memory, licence."""
        size = self.download_size
        here = ("✓ here" if size else "included") if self.downloaded else size or "?"
        return [
            self.id + ("  ★" if self.id == recommended else ""),
            self.status,
            f"{self.params / 1e6:,.0f} M" if self.params else "?",
            f"{size} {here}".strip() if self.downloaded and size else here,
            f"{self.rounds_per_hour:.0f}",
            f"{self.memory_gb:.1f} GB",
            self.license or "?",
        ]

    def details(self) -> str:
        parts = []
        if self.params:
            parts.append(f"{self.params / 1e6:,.0f} M parameters")
        if self.download_gb:
            parts.append(f"{self.download_size} download" + (" (already here)" if self.downloaded else ""))
        if self.license:
            parts.append(f"licence {self.license}")
        if self.round_seconds:
            parts.append(f"about {self.rounds_per_hour:.0f} rounds per hour")
        return ", ".join(parts)

    def summary(self, budget_gb: float) -> str:
        """'fits: 6.7 of 16.9 GB, a round ~184 s'."""
        return f"{self.status}: {self.memory_gb:.1f} of {budget_gb:.1f} GB, a round ~{self.round_seconds:.0f} s"


def _catalogue_facts(model_id: str) -> dict[str, Any]:
    """Parameters, licence and whether the file is here, from the catalogue (not in the scan's JSON)."""
    from sapo_core.catalog import CatalogError, load_catalogue

    try:
        e = load_catalogue().get(model_id)
    except CatalogError:
        return {}
    return {"params": e.params, "license": e.license, "downloaded": e.embedded or _in_hub_cache(e)}


def _in_hub_cache(e: Any) -> bool:
    """The GGUF is in the hub cache (huggingface_hub's layout), so choosing it downloads nothing."""
    from sapo_core.modelfiles import default_cache_dir

    repo_dir = default_cache_dir() / f"models--{e.repo.replace('/', '--')}" / "snapshots"
    return any((d / e.filename).is_file() for d in repo_dir.glob("*")) if repo_dir.is_dir() else False


@dataclass(frozen=True)
class HardwareReport:
    machine: list[tuple[str, str, str]]  # (what, value, how it was found)
    budget_gb: float
    recommended: str
    recommended_reason: str
    models: list[ModelOption]
    warnings: list[str] = field(default_factory=list)
    probe: dict[str, Any] | None = None  # this machine's measured round (probe.py), if there is one

    @property
    def measured(self) -> bool:
        """Whether the round times come from rounds measured here, not the formula."""
        return self.probe is not None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareReport:
        prof = data["profile"]

        def item(key: str) -> tuple[Any, str]:
            return prof[key]["value"], prof[key]["reason"]

        gpus, gpu_why = item("gpus")
        gpu_text = ", ".join(f"{g['name']} ({g['memory_gb']:.1f} GB)" for g in gpus) or "none"
        machine = [
            (
                "CPU cores",
                f"{item('cpu_physical')[0]} physical, {item('cpu_logical')[0]} logical",
                item("cpu_physical")[1],
            ),
            (
                "Memory",
                f"{item('ram_total_gb')[0]:.1f} GB, {item('ram_available_gb')[0]:.1f} GB free",
                item("ram_available_gb")[1],
            ),
            ("GPU", gpu_text, gpu_why),
            ("Trains on", str(item("device")[0]).upper(), item("device")[1]),
            ("Free disk", f"{item('disk_free_gb')[0]:.0f} GB", item("disk_free_gb")[1]),
        ]
        models = [
            ModelOption(
                id=m["id"],
                status=m["status"],
                reason=m["reason"],
                memory_gb=float(m["memory_gb"]["host"]),
                gpu_gb=float(m["memory_gb"]["gpu"]),
                round_seconds=float(m["round_estimate"]["seconds"]),
                download_gb=float(m.get("disk_gb", {}).get("download", 0.0)),
                **_catalogue_facts(m["id"]),
            )
            for m in data["models"]
        ]
        choice = data["choice"]
        return cls(
            machine=machine,
            budget_gb=float(data["ram_budget_gb"]),
            recommended=choice["model"],
            recommended_reason=choice["reason"],
            models=models,
            warnings=list(choice.get("warnings", [])),
            probe=data.get("probe") if isinstance(data.get("probe"), dict) else None,
        )

    def option(self, model_id: str) -> ModelOption | None:
        return next((m for m in self.models if m.id == model_id), None)


class HardwareScan(QObject):
    finished = Signal(object)
    """HardwareReport: the scan worked."""
    failed = Signal(str)
    """Why the scan did not work (the wizard goes on with model 'auto')."""

    def __init__(self, parent: QObject | None = None, python: str | None = None) -> None:
        super().__init__(parent)
        self.python = python or sys.executable
        self.process: QProcess | None = None

    def start(self, probe: bool = False) -> None:
        """Scan; with `probe`, first measure this machine (two real rounds of the embedded model,
        about a minute, cached: `sapo-node hardware --probe`)."""
        p = self.process = QProcess(self)
        p.finished.connect(self._on_process_finished)
        p.errorOccurred.connect(self._on_process_error_occurred)
        # judged as 'auto': the recommendation must not depend on the model the config names now
        args = ["-m", "sapo_core.cli", "hardware", "--json", "--model", "auto"] + (["--probe"] if probe else [])
        p.start(self.python, args)

    def running(self) -> bool:
        return self.process is not None and self.process.state() != QProcess.ProcessState.NotRunning

    def cancel(self) -> None:
        if self.running():
            self.process.kill()
            self.process.waitForFinished(2000)

    def _on_process_finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        out = bytes(self.process.readAllStandardOutput()).decode("utf-8", "replace")
        err = bytes(self.process.readAllStandardError()).decode("utf-8", "replace").strip()
        if code != 0:
            self.failed.emit(err.splitlines()[-1] if err else f"sapo-node hardware exited with code {code}")
            return
        try:
            self.finished.emit(HardwareReport.from_json(json.loads(out)))
        except (ValueError, KeyError, TypeError) as e:
            self.failed.emit(f"could not read the scan's output: {e!r}")

    def _on_process_error_occurred(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.failed.emit(f"could not start {self.python} to scan this computer")


__all__ = ["HardwareScan", "HardwareReport", "ModelOption", "VERDICT_ORDER"]
