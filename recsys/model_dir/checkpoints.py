"""A run's checkpoints: save, resume at the exact step, skip damaged ones.

`RunCheckpoints` holds the `tf.train.Checkpoint` of a run's objects and its
`tf.train.CheckpointManager`s in the run folder (`run_dir.RunDir`). Every
worker of a MultiWorkerMirroredStrategy must take part in a save (it may
all-reduce), but only the chief writes the run's checkpoints: the others
write to a scratch folder they delete, and all read the chief's.

Example:
  >>> ckpts = RunCheckpoints(run_dir, {"model": model, "step": step},
  ...                        step, backend, max_to_keep=3)
  >>> ckpts.restore()  # the restored step, 0 for a new run
  >>> ckpts.save()     # the checkpoint's path
"""

import logging
import os
import shutil
from collections.abc import Mapping
from typing import Any

from recsys._keras import tf
from recsys.errors import RecsysError
from recsys.model_dir import run_dir as run_dir_lib
from recsys.model_dir import run_files

log = logging.getLogger("recsys.training")


class CorruptCheckpointError(RecsysError, RuntimeError):
  """Checkpoints exist in the model dir but none of them reads back whole."""


# What reading a damaged checkpoint raises (truncated data or index file;
# TF's reader raises IndexError "Read less bytes than requested").
UNREADABLE_CHECKPOINT_ERRORS = (
  tf.errors.DataLossError,
  tf.errors.OutOfRangeError,
  tf.errors.NotFoundError,
  tf.errors.InvalidArgumentError,
  IndexError,
)


class RunCheckpoints:
  """The checkpoints of one run, as the chief or a non-chief worker.

  Args:
    run_dir: the run folder (`chief` is taken from it).
    objects: what a checkpoint holds, by name (model, optimizers, step, ...).
    global_step: the step counter (checkpoint numbers).
    backend: the embedding backend (checked against a checkpoint's tables).
    max_to_keep: checkpoints kept in the run folder.
  """

  def __init__(
    self,
    run_dir: run_dir_lib.RunDir,
    objects: Mapping[str, Any],
    global_step: tf.Variable,
    backend: Any,
    max_to_keep: int,
  ):
    self.run_dir = run_dir
    self.global_step = global_step
    self.backend = backend
    self.checkpoint = tf.train.Checkpoint(**objects)
    self.read_manager = tf.train.CheckpointManager(
      self.checkpoint,
      run_dir.checkpoints,
      max_to_keep=max_to_keep,
      step_counter=global_step,
    )
    self.manager = self.read_manager
    if not run_dir.chief:
      self.manager = tf.train.CheckpointManager(
        self.checkpoint,
        run_dir.scratch("checkpoints"),
        max_to_keep=1,
        step_counter=global_step,
      )
    self.saved_step: int | None = None

  @property
  def latest(self) -> str | None:
    """The newest checkpoint of the run (the chief's), or None."""
    return self.read_manager.latest_checkpoint

  def restore(self) -> int:
    """Restores the newest readable checkpoint of the model dir.

    Checkpoints are tried newest first. One whose files cannot be read back
    whole (truncated or corrupted after it was written) is skipped with a
    warning naming it, and left on disk; an incompatible one (another run's
    tables) raises at once: falling back would silently train another model.

    Returns:
      The restored step (0 when there is no checkpoint).

    Raises:
      backends.checkpoint.CheckpointMismatchError: the newest checkpoint
        belongs to a different configuration.
      CorruptCheckpointError: checkpoints exist but none reads back.
    """
    candidates = list(reversed(self.read_manager.checkpoints))
    if not candidates:
      return 0
    from backends import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
    from backends.storage import row_sharded_checkpoint  # pylint: disable=g-import-not-at-top

    failures = []
    for path in candidates:
      try:
        ckpt_lib.verify_compatible(path, self.backend)
        ckpt_lib.verify_objects(
          path,
          self.checkpoint,
          hint=f" The run that wrote it kept its settings in "
          f"{self.run_dir.operative_config}; use "
          "the same model and optimizers, or another --model_dir.",
        )
        # A table trained in another dtype (EmbeddingPlacement.table_dtype
        # changed, or a narrow run served float32) is cast.
        with ckpt_lib.casting_tables(path, self.backend):
          row_sharded_checkpoint.restore(
            self.checkpoint,
            path,
            lambda p: self.checkpoint.restore(
              p
            ).assert_existing_objects_matched(),
          )
      except UNREADABLE_CHECKPOINT_ERRORS as e:
        reason = (
          str(e).strip().splitlines()[0][:300] if str(e) else type(e).__name__
        )
        log.warning(
          "checkpoint %s is unreadable (%s); trying an older one. "
          "It is left on disk.",
          path,
          reason,
        )
        failures.append(f"{path}: {reason}")
        continue
      step = int(self.global_step.numpy())
      self.saved_step = step
      log.info("restored %s at step %d", path, step)
      return step
    raise CorruptCheckpointError(
      f"no checkpoint in {self.read_manager.directory!r} reads back whole: "
      + "; ".join(failures)
      + ". Move the directory aside to start over."
    )

  def save(self) -> str:
    """Saves a checkpoint at the current step; returns the chief's path."""
    from backends.storage import row_sharded_checkpoint  # pylint: disable=g-import-not-at-top

    step = int(self.global_step.numpy())
    try:
      # Row-sharded tables: each worker writes its rows beside the chief's
      # checkpoint, which merges them in
      # (backends.storage.row_sharded_checkpoint).
      path = row_sharded_checkpoint.save(
        self.checkpoint,
        self.backend.strategy,
        lambda options: self.manager.save(
          checkpoint_number=step, options=options
        ),
        chief=self.run_dir.chief,
        chief_prefix=lambda p: os.path.join(
          self.read_manager.directory, os.path.basename(p)
        ),
      )
    except (OSError, tf.errors.OpError):  # e.g. the disk is full
      # TF leaves the shards it was writing in `ckpt-<step>_temp`: remove
      # them (the last complete checkpoint stays) and report the error.
      run_files.remove_partial_checkpoint(self.manager.directory, step)
      row_sharded_checkpoint.remove_rows(
        os.path.join(self.read_manager.directory, f"ckpt-{step}")
      )
      raise
    self.saved_step = step
    if not self.run_dir.chief:
      shutil.rmtree(self.manager.directory, ignore_errors=True)
      path = os.path.join(self.read_manager.directory, os.path.basename(path))
    log.info("saved checkpoint %s", path)
    return path

  def save_if_new(self, step: int) -> str:
    """Saves unless this step is saved already (same on every worker)."""
    if self.saved_step == step:
      return os.path.join(self.read_manager.directory, f"ckpt-{step}")
    return self.save()
