"""A node's run directory: the run store, the checkpoint a restart resumes from, and the model file
the run trains on.

What the round loop needs from its files beyond saving: a damaged store set aside, a checkpoint
checked against the model before it is loaded, a message that says what survived a failed save.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from sapo_core.catalog import load_catalogue
from sapo_core.checkpoint import Checkpoints, CheckpointState
from sapo_core.config import NodeConfig
from sapo_core.fsutil import write_trouble
from sapo_core.modelfiles import file_stamp
from sapo_core.policy import Policy
from sapo_core.store import STORE_NAME, RunStore, StoreError
from sapo_core.tasks import TaskSet
from sapo_core.trainer import Trainer

log = logging.getLogger(__name__)


class NodeError(RuntimeError):
    """The node cannot run; the message says what to change."""


@dataclass
class BaseFile:
    """The model file a run trains on, as the node found it at its start."""

    path: Path
    stamp: tuple[int, int]  # size, modification time (modelfiles.file_stamp)
    sha256: str
    changed_said: bool = False

    def check(self) -> None:
        """Say once if the model file changed on disk while the node runs. The node goes on with
        the model it loaded (in memory; the sampler's copy is its own); the next start compares
        the file with the checkpoint's record of it."""
        try:
            now = file_stamp(self.path)
        except OSError:
            now = None
        if now != self.stamp and not self.changed_said:
            self.changed_said = True
            log.warning(
                f"the model file {self.path} changed on disk (or went) while the node runs: this run goes on "
                "with the model it loaded; the next start checks the file against this run's checkpoint"
            )


def open_store(run_dir: Path) -> RunStore:
    """The run store; a damaged one (not a database any more, malformed) is set aside and a new
    one started: the progress is the checkpoint's, the store holds the figures."""
    path = run_dir / STORE_NAME
    try:
        return RunStore(path)
    except StoreError as e:
        cause = e.__cause__
        if type(cause) is not sqlite3.DatabaseError:  # exactly: not OperationalError (locked, read-only)
            raise NodeError(str(e)) from e
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{path}{suffix}").exists():
                os.replace(f"{path}{suffix}", f"{aside}{suffix}")
        log.warning(
            f"run store {path} is damaged ({cause}): set aside as {aside.name} and a new one started; "
            "training goes on from the last checkpoint, the figures of earlier rounds stay in the damaged file"
        )
        return RunStore(path)


def resume(
    run_dir: Path,
    checkpoints: Checkpoints,
    store: RunStore,
    policy: Policy,
    trainer: Trainer,
    tasks: TaskSet,
    base: BaseFile | None,
) -> CheckpointState | None:
    """Load the last checkpoint into the policy, the trainer and the tasks' curriculum, after
    checking it belongs to this model; its state (the round, the shape, the receipts in `extra`
    are the node's to take), or None when the run is new."""
    if not checkpoints.exists():
        return None
    state, trainable, optimizer = checkpoints.load()
    if state.model_id != policy.model_id or state.lora_rank != policy.lora_rank:
        raise NodeError(
            f"{run_dir} holds a run of {state.model_id} (LoRA rank {state.lora_rank}); this config "
            f"trains {policy.model_id} (rank {policy.lora_rank}). Use another --run-dir."
        )
    was = state.extra.get("base_sha256")
    if was and base is not None and was != base.sha256:
        raise NodeError(
            f"the model file {base.path} changed since this run's last checkpoint (SHA-256 {was[:12]}… "
            f"then, {base.sha256[:12]}… now): what was trained belongs to the file before. Put that "
            f"file back to go on, or start a new run (another --run-dir; the app: Settings, Setup again)."
        )
    policy.load_trainable_state_dict(trainable)
    trainer.load_state_dict(optimizer)
    policy.version = state.policy_version
    if "tasks" in state.extra:
        tasks.load_state_dict(state.extra["tasks"])
    if not store.has_round(state.round) and "metrics" in state.extra:
        # the crash fell between the checkpoint and the store row: restore the row
        store.record_round(state.round, state.extra["metrics"], state.extra.get("started", time.time()))
    log.info(f"resumed after round {state.round}")
    return state


def keep_run_model(cfg: NodeConfig, was: str | None) -> tuple[NodeConfig, str]:
    """A run goes on with the model it began with (`was`: the store's or the checkpoint's model
    id): with model.name 'auto' the choice is made once, when the run is new. Chosen again at
    every start it could move with the RAM free that day or a new probe (`sapo-node hardware
    --probe` finds bigger models fast enough), and the checkpoint would then refuse the other
    model. Returns the config to run and what was kept ('' when the config names its model, or
    the run is new, or its model is not in the catalogue)."""
    if cfg.model.name != "auto" or cfg.model.gguf_path or not was or was not in load_catalogue().ids():
        return cfg, ""
    kept = f"{was}, the model this run began with (model 'auto' chooses again only for a new run directory)"
    return cfg.replace(**{"model.name": was}), kept


def save_failed(run_dir: Path, r: int, error: Exception, saved: bool) -> str:
    """What a failed save of round `r` means (`saved`: its checkpoint was written): the message of
    the node's error."""
    why = write_trouble(run_dir, error) or f"{type(error).__name__}: {error}"
    done = r if saved else r - 1
    return (
        f"round {r} could not be saved in {run_dir}: {why}. Nothing finished is lost: the next "
        f"start resumes after round {done}"
        + (f" (round {r}'s figures come back from its checkpoint)." if saved else ".")
    )


__all__ = ["BaseFile", "NodeError", "keep_run_model", "open_store", "resume", "save_failed"]
