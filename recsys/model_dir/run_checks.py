"""What a trained run may not change under it: its settings and its data.

A model dir holds one experiment. Every command that goes on from its
checkpoint compares what it would use now with what the run recorded: the
math settings of its latest operative config (`run_configs`) and the
fingerprints of the files its sources read (`run_inputs`).

  train     (a resume) continues the same experiment;
  evaluate  scores it on its own evaluation split; with `other_data`
            (`recsys evaluate --eval_on NAME`) the data settings and files
            may differ on purpose, the model's may not;
  export    serves it (the raw signature's vocabularies and histories come
            from the data).

A difference is refused (`ChangedSettingsError`, listing each
`setting: old -> new` and each changed file) unless allowed
(`--allow_changed_settings`, gin `train.allow_changed_settings = True`);
allowed changes are logged, and recorded in the run folder
(`changed_settings.jsonl`, `run_dir.RunDir.record_changes`) and in the
command's output.

Example:
  >>> changes = compare(old_config, new_config, old_files, new_files)
  >>> changes.lines()
  ['MovieLens.seed: 0 -> 1']
"""

import dataclasses
import os
import re
from collections.abc import Mapping

from recsys.model_dir import run_configs, run_inputs
from recsys.model_dir.run_configs import ChangedSettingsError

COMMANDS = ("train", "evaluate", "export")


@dataclasses.dataclass
class RunChanges:
  """What differs from the run: settings `(key, old, new)` and files."""

  settings: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  files: list[str] = dataclasses.field(default_factory=list)

  def __bool__(self) -> bool:
    return bool(self.settings or self.files)

  def lines(self) -> list[str]:
    """One line per change: `key: old -> new`, then `file <what changed>`."""
    return [
      f"{key.rstrip('.')}: {old} -> {new}"  # a macro's key is "NAME."
      for key, old, new in self.settings
    ] + [f"file {line}" for line in self.files]


def compare(
  old_config: str | None,
  new_config: str,
  old_files: Mapping[str, run_inputs.Fingerprint] | None,
  new_files: Mapping[str, run_inputs.Fingerprint],
  other_data: bool = False,
) -> RunChanges:
  """The changes between what the run recorded and what is used now.

  Args:
    old_config, old_files: the run's latest operative config and input
      fingerprints (None: not recorded, e.g. a run from Python without gin
      or from an older recsys; nothing to compare).
    new_config, new_files: this command's.
    other_data: the data settings and files may differ (evaluating on other
      data on purpose); only the other settings count.
  """
  settings: list[tuple[str, str, str]] = []
  if old_config is not None and run_configs.bindings(new_config):
    settings = run_configs.changed_settings(old_config, new_config)
    if other_data:
      data = run_configs.data_settings(old_config)
      data |= run_configs.data_settings(new_config)
      settings = [c for c in settings if c[0] not in data]
  files: list[str] = []
  if old_files is not None and not other_data:
    files = run_inputs.changed_files(old_files, new_files)
  return RunChanges(settings, files)


def refuse(
  changes: RunChanges,
  command: str,
  step: int,
  model_dir: str,
  record_path: str,
) -> None:
  """Raises the `ChangedSettingsError` of `command` for `changes`."""
  listed = "\n".join(f"  {line}" for line in changes.lines())
  configs = os.path.join(model_dir, run_configs.CONFIGS_DIR)
  what = (
    "settings and data"
    if changes.settings and changes.files
    else "data"
    if changes.files
    else "settings"
  )
  allow = (
    "pass --allow_changed_settings (gin: train.allow_changed_settings = "
    f"True) to go ahead; it is recorded in {record_path}"
  )
  files_hint = (
    " Put back the files the run read (or point the data settings at a "
    "copy of them)."
    if changes.files
    else ""
  )
  if command == "train":
    raise ChangedSettingsError(
      f"the checkpoint at step {step} in {model_dir} was trained with other "
      f"{what}; resuming would change:\n{listed}\nUse the same settings "
      f"and files to resume, another --model_dir to start a new run, or "
      f"{allow} (every run's config is kept in {configs}/).{files_hint}"
    )
  verb = "evaluating" if command == "evaluate" else "exporting"
  other = (
    ", --eval_on NAME to evaluate on other data on purpose (its results "
    "go to eval_metrics-NAME.json, never to eval_metrics.json),"
    if command == "evaluate"
    else ""
  )
  raise ChangedSettingsError(
    f"the run in {model_dir} (step {step}) was trained with other {what} "
    f"than {verb} it now would use:\n{listed}\nUse the run's own settings "
    "(without --gin_file the run's operative_config.gin is read; drop the "
    f"--gin_bindings that change the above){other} or {allow} and in the "
    f"output.{files_hint}"
  )


_VARIABLES_DIFFER = re.compile(r"(\d+) variable\(s\) differ")
#: The changed settings a mismatch lists at most.
_SETTINGS_SHOWN = 12


def explain_mismatch(
  error: Exception, old_config: str | None, new_config: str, model_dir: str
) -> Exception:
  """What to raise for a checkpoint whose variables do not fit this run's.

  The checkpoint's check lists every variable (55 for DCN-v2 trained into
  DLRM's model dir), which says nothing of why; when the run's recorded
  settings differ from this one's, the settings are the reason: a
  `ChangedSettingsError` lists them (`setting: old -> new`, as a resume's
  check does), the variables summarized. Else `error` itself.

  Args:
    error: the checkpoint's mismatch (`backends.checkpoint`).
    old_config: the run's latest operative config (None: not recorded).
    new_config: this command's.
    model_dir: the run folder.
  """
  if old_config is None or not run_configs.bindings(new_config):
    return error
  settings = run_configs.changed_settings(old_config, new_config)
  if not settings:
    return error
  listed = [
    f"  {key.rstrip('.')}: {old} -> {new}" for key, old, new in settings
  ]
  if len(listed) > _SETTINGS_SHOWN:
    more = len(listed) - _SETTINGS_SHOWN
    listed = listed[:_SETTINGS_SHOWN] + [f"  ... and {more} more"]
  message = str(error)
  count = _VARIABLES_DIFFER.search(message)
  first = next(
    (
      line.strip()[2:]
      for line in message.splitlines()
      if line.strip()[:2] == "- "
    ),
    "",
  )
  variables = (
    f"{count.group(1) + ' of its' if count else 'its'} variables do not fit "
    f"this model{' (e.g. ' + first + ')' if first else ''}"
  )
  configs = os.path.join(model_dir, run_configs.CONFIGS_DIR)
  return ChangedSettingsError(
    f"the checkpoint in {model_dir} was trained with other settings:\n"
    + "\n".join(listed)
    + f"\nso {variables}. Use the settings it was trained with (every run's "
    f"config is kept in {configs}/), or another --model_dir to start a new "
    "run."
  )


__all__ = [
  "COMMANDS",
  "ChangedSettingsError",
  "RunChanges",
  "compare",
  "explain_mismatch",
  "refuse",
]
