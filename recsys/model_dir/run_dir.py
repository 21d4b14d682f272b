"""The run folder (`--model_dir`): its layout, and who writes what in it.

The one module that knows where a run keeps its files; the trainer, `recsys
evaluate` and `recsys export` ask it for paths. Layout:

  <model_dir>/
    checkpoints/                  tf.train.CheckpointManager's checkpoints
    operative_config.gin          the latest run's gin config
    configs/operative_config-<k>.gin   every run's config (`run_configs`)
    input_files.json              fingerprints of the files the latest run
                                  read (`run_inputs`)
    configs/input_files-<k>.json  every run's
    changed_settings.jsonl        each resume, evaluate or export that went
                                  ahead with changed settings or files
    metrics.json                  the final metrics of the latest run
    eval_metrics.json             `recsys evaluate`'s metrics
    eval_metrics-<name>.json      `recsys evaluate --eval_on <name>`'s
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

import datetime
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from recsys.errors import RecsysError
from recsys.model_dir import lock as lock_lib
from recsys.model_dir import run_checks, run_configs, run_files, run_inputs

log = logging.getLogger("recsys.training")

CHECKPOINTS_DIR = "checkpoints"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
METRICS_FILE = "metrics.json"
EVAL_METRICS_FILE = "eval_metrics.json"
INPUT_FILES_FILE = "input_files.json"
CHANGES_FILE = "changed_settings.jsonl"
#: What `--eval_on` may be called (it names a file in the run folder).
EVAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
WORKERS_DIR = ".workers"
SUMMARY_KINDS = ("train", "eval")


class ModelDirNotWritableError(RecsysError, PermissionError):
  """Training would write into a model dir (or a folder of it) that this
  user may not write."""


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

  def other_eval_metrics(self, name: str) -> str:
    """`eval_metrics-<name>.json`: an evaluation on other data (`--eval_on`).

    Raises:
      ValueError: `name` is not a plain name (letters, digits, `_.-`).
    """
    if not EVAL_NAME.fullmatch(name):
      raise ValueError(
        f"--eval_on {name!r}: use a plain name (letters, digits, '_', '.', "
        "'-'; at most 64), e.g. --eval_on seed1; it names "
        "eval_metrics-<name>.json in the model dir."
      )
    return os.path.join(self.path, f"eval_metrics-{name}.json")

  @property
  def input_files(self) -> str:
    return os.path.join(self.path, INPUT_FILES_FILE)

  @property
  def changes_log(self) -> str:
    return os.path.join(self.path, CHANGES_FILE)

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

  def check_writable(self) -> None:
    """Refuses a model dir that training cannot write, before anything is
    built: the folder itself, the folders a run writes into and the lock
    file it opens, when they exist (a new model dir is made by training).

    Raises:
      ModelDirNotWritableError: naming the folder or file and what to do.
    """
    configs = os.path.join(self.path, run_configs.CONFIGS_DIR)
    paths = [self.path, self.checkpoints, configs]
    paths += [self.summaries(kind) for kind in SUMMARY_KINDS]
    paths.append(os.path.join(self.path, lock_lib.LOCK_FILE))
    for path in paths:
      if not os.path.exists(path):
        continue
      mode = os.W_OK | (os.X_OK if os.path.isdir(path) else 0)
      if not os.access(path, mode):
        where = "" if path == self.path else f" ({path} is read-only)"
        raise ModelDirNotWritableError(
          f"model dir {self.path!r} is not writable by this user{where}: "
          "training writes its checkpoints, summaries, config and lock "
          "there. Make it writable (e.g. chmod -R u+w), or train on a "
          "writable copy (copy the folder, pass the copy as --model_dir); "
          "`recsys evaluate` and `recsys export` only read a model dir."
        )

  def refuse_links(self) -> None:
    """Refuses up front a metrics file that is a link (before training)."""
    if self.chief:
      run_files.refuse_links(self.path, [METRICS_FILE])

  def check(
    self,
    command: str,
    config_text: str,
    files: Mapping[str, run_inputs.Fingerprint],
    step: int,
    allow: bool,
    other_data: bool = False,
  ) -> run_checks.RunChanges:
    """What `command` ("train": a resume, "evaluate", "export") would change
    in the run at `step`: its math settings and input files
    (`run_checks`; only the chief compares).

    Returns:
      Every change (data ones too with `other_data`), allowed; empty: none.

    Raises:
      ChangedSettingsError: something changed that `other_data` does not
        cover, and `allow` is False.
    """
    if not self.chief:
      return run_checks.RunChanges()
    old_files = self.read_input_files()
    recorded = (
      self._read(self.operative_config),
      config_text,
      old_files,
      files,
    )
    for path in run_inputs.unverified_files(old_files or {}, files):
      log.warning(
        "%s was modified since the run read it; its size and first and last "
        "%d bytes are the same (a file this large is not hashed whole), so "
        "it is taken for the same data.",
        path,
        run_inputs.EDGE_BYTES,
      )
    changes = run_checks.compare(*recorded)
    refused = (
      run_checks.compare(*recorded, other_data=True) if other_data else changes
    )
    if refused and not allow:
      run_checks.refuse(refused, command, step, self.path, self.changes_log)
    return changes

  def explain_mismatch(self, error: Exception, config_text: str) -> Exception:
    """What to raise for a checkpoint here that does not fit a run with
    `config_text` (`run_checks.explain_mismatch`)."""
    return run_checks.explain_mismatch(
      error, self._read(self.operative_config), config_text, self.path
    )

  def metrics_step(self) -> int | None:
    """The step `metrics.json` describes (None: no such file or step)."""
    text = self._read(self.metrics)
    try:
      step = json.loads(text)["step"] if text is not None else None
    except (ValueError, KeyError, TypeError):
      return None
    return int(step) if isinstance(step, (int, float)) else None

  def read_input_files(self) -> dict[str, run_inputs.Fingerprint] | None:
    """The input fingerprints the latest run recorded (None: none)."""
    text = self._read(self.input_files)
    return None if text is None else json.loads(text)["files"]

  @staticmethod
  def _read(path: str) -> str | None:
    if not os.path.isfile(path):
      return None
    with open(path, encoding="utf-8") as f:
      return f.read()

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

  def write_input_files(
    self, files: Mapping[str, run_inputs.Fingerprint], step: int
  ) -> str:
    """Writes `input_files.json` (the latest run's input fingerprints, at
    the step it started from) and this run's numbered copy next to its
    config (call after `write_operative_config`)."""
    if not self.chief:
      return self.input_files
    text = json.dumps(
      {"step": step, "files": dict(files)}, indent=2, sort_keys=True
    )
    if self._run_config_path is not None:
      numbered = self._run_config_path.replace(
        "operative_config-", "input_files-"
      )
      run_files.write_text(numbered[: -len(".gin")] + ".json", text)
    return run_files.write_text(self.input_files, text)

  def record_changes(
    self,
    command: str,
    step: int,
    changes: run_checks.RunChanges,
    output: str | None = None,
  ) -> str:
    """Appends one line to `changed_settings.jsonl`: which command went
    ahead at which step with which changes, and where its output went."""
    entry = {
      "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"
      ),
      "command": command,
      "step": step,
      "changes": changes.lines(),
    }
    if output:
      entry["output"] = output
    old = self._read(self.changes_log) or ""
    return run_files.write_text(
      self.changes_log, old + json.dumps(entry, sort_keys=True) + "\n"
    )

  def write_metrics(self, metrics: Mapping[str, Any]) -> str:
    """Writes `metrics.json` (sorted keys, indented); chief only."""
    if not self.chief:
      return self.metrics
    return run_files.write_text(
      self.metrics, json.dumps(dict(metrics), indent=2, sort_keys=True)
    )

  def write_eval_metrics(
    self, metrics: Mapping[str, Any], name: str | None = None
  ) -> str:
    """Writes `eval_metrics.json` (what `recsys evaluate` printed), or
    `eval_metrics-<name>.json` for an evaluation on other data."""
    path = self.other_eval_metrics(name) if name else self.eval_metrics
    return run_files.write_text(
      path, json.dumps(dict(metrics), indent=2, sort_keys=True)
    )


__all__ = [
  "CHANGES_FILE",
  "CHECKPOINTS_DIR",
  "EVAL_METRICS_FILE",
  "INPUT_FILES_FILE",
  "METRICS_FILE",
  "ModelDirNotWritableError",
  "OPERATIVE_CONFIG_FILE",
  "RunDir",
]
