"""The run folder (`--model_dir`): its layout, and who writes what in it.

The one module that knows where a run keeps its files; the trainer, `recsys
evaluate` and `recsys export` ask it for paths. Layout:

  <model_dir>/
    checkpoints/                  tf.train.CheckpointManager's checkpoints
    operative_config.gin          the latest run's gin config
    configs/operative_config-<k>.gin   every run's config (`run_configs`)
    metrics.json                  the final metrics of the latest run
    eval_metrics.json             `recsys evaluate`'s metrics
    train/, eval/                 TensorBoard summaries
    .recsys.lock                  held while a run trains (`lock`)
    .workers/<task>-<i>/          scratch of non-chief workers (deleted)

Only the chief writes; the other workers of a multi-worker run write their
share of a checkpoint to their scratch folder and read the chief's. Files
are written without following links (`run_files`).

Example:
  >>> run = RunDir("/tmp/run")
  >>> run.checkpoints
  '/tmp/run/checkpoints'
  >>> run.write_metrics({"eval/auc": 0.75})
"""

import json
import os
from collections.abc import Mapping
from typing import Any

from recsys.training import lock as lock_lib
from recsys.training import run_configs, run_files

CHECKPOINTS_DIR = "checkpoints"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
METRICS_FILE = "metrics.json"
EVAL_METRICS_FILE = "eval_metrics.json"
WORKERS_DIR = ".workers"
SUMMARY_KINDS = ("train", "eval")


class RunDir:
  """One run folder, as seen by one process of the run.

  Args:
    path: the model dir.
    chief: whether this process writes the run's files (False: a non-chief
      worker of a multi-worker run, which writes nothing of its own here).
    task: a non-chief worker's `(task_type, task_id)`, naming its scratch.
  """

  def __init__(
    self, path: str, chief: bool = True, task: tuple[str, int] | None = None
  ):
    self.path = path
    self.chief = chief
    self._task = task
    self._run_config_path: str | None = None

  # -- paths -------------------------------------------------------------------

  @property
  def checkpoints(self) -> str:
    return os.path.join(self.path, CHECKPOINTS_DIR)

  @property
  def operative_config(self) -> str:
    return os.path.join(self.path, OPERATIVE_CONFIG_FILE)

  @property
  def metrics(self) -> str:
    return os.path.join(self.path, METRICS_FILE)

  @property
  def eval_metrics(self) -> str:
    return os.path.join(self.path, EVAL_METRICS_FILE)

  def summaries(self, kind: str) -> str:
    """The TensorBoard folder of `kind` ("train" or "eval")."""
    return os.path.join(self.path, kind)

  def scratch(self, name: str) -> str:
    """A non-chief worker's own folder for files only the chief keeps."""
    task_type, task_id = self._task or ("worker", 0)
    return os.path.join(self.path, WORKERS_DIR, f"{task_type}-{task_id}", name)

  # -- the run -----------------------------------------------------------------

  def lock(self) -> lock_lib.ModelDirLock:
    """The run's exclusive lock (acquire it while training)."""
    return lock_lib.ModelDirLock(self.path)

  def refuse_links(self) -> None:
    """Refuses up front a metrics file that is a link (before training)."""
    if self.chief:
      run_files.refuse_links(self.path, [METRICS_FILE])

  def check_resume(
    self, config_text: str, step: int, allow: bool
  ) -> list[tuple[str, str, str]]:
    """The math settings changed since the run resumed at `step` wrote its
    config (`run_configs.check_resume`; only the chief compares)."""
    if not self.chief:
      return []
    return run_configs.check_resume(
      self.operative_config, config_text, step, allow
    )

  # -- files -------------------------------------------------------------------

  def write_operative_config(self, text: str) -> str:
    """Writes `operative_config.gin` (the latest run's) and this run's own
    numbered copy (`configs/operative_config-<k>.gin`, see `run_configs`)."""
    if not self.chief:
      return self.operative_config
    if self._run_config_path is None:
      self._run_config_path = run_configs.next_config_path(self.path)
      os.makedirs(os.path.dirname(self._run_config_path), exist_ok=True)
    run_files.write_text(self._run_config_path, text)
    return run_files.write_text(self.operative_config, text)

  def write_metrics(self, metrics: Mapping[str, Any]) -> str:
    """Writes `metrics.json` (sorted keys, indented); chief only."""
    if not self.chief:
      return self.metrics
    return run_files.write_text(
      self.metrics, json.dumps(dict(metrics), indent=2, sort_keys=True)
    )

  def write_eval_metrics(self, metrics: Mapping[str, Any]) -> str:
    """Writes `eval_metrics.json` (what `recsys evaluate` printed)."""
    return run_files.write_text(
      self.eval_metrics, json.dumps(dict(metrics), indent=2, sort_keys=True)
    )


__all__ = [
  "CHECKPOINTS_DIR",
  "EVAL_METRICS_FILE",
  "METRICS_FILE",
  "OPERATIVE_CONFIG_FILE",
  "RunDir",
]
