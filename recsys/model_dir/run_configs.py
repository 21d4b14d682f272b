"""Each run's operative config, kept numbered, and which settings changed.

A model dir holds one training history. Every `train()` on it (the first run
and each resume) keeps its operative config as
`configs/operative_config-<k>.gin` (k = 1, 2, ...; never overwritten), and
`operative_config.gin` is the latest (what `recsys evaluate` and `export`
rebuild the model from).

A resume whose settings differ from the previous run's in anything that
changes the math (data, model, optimizers, batch size, seed, embedding
settings, ...) would silently continue another experiment from this one's
checkpoint: it is refused, naming the settings, unless allowed explicitly
(`run_checks`, which also guards `recsys evaluate` and `recsys export`).
Settings that only change how a run is executed or reported (steps, loop
and checkpoint cadence, evaluation, backend, replicas, compilation) may change.

Example:
  >>> changes = changed_settings(old_config_text, gin.operative_config_str())
  >>> [(key, old, new) for key, old, new in changes]
  [('EmbeddingSettings.combiner', "'mean'", "'sum'")]
"""

import dataclasses
import glob
import json
import os
import re

from gin import config_parser

from recsys import planning
from recsys import train_settings as settings_lib
from recsys.errors import RecsysError

CONFIGS_DIR = "configs"

#: `train` arguments that do not change the numbers a resumed run computes:
#: the settings declared `EXECUTION` (`recsys.train_settings`) and the
#: `train` arguments that are no setting: the action, and the strategy's
#: TPU and replicas (built before `train` is called, not a `TrainSettings`
#: field). Where tables live gives the same numbers on any placement: every
#: field of `EmbeddingPlacement` (`train.placement`).
EXECUTION_SETTINGS = frozenset(
  f"train.{name}"
  for name in (
    *settings_lib.names_of_kind(settings_lib.EXECUTION),
    "action",
    "tpu",
    "num_cpu_replicas",
  )
) | frozenset(
  f"EmbeddingPlacement.{field.name}"
  for field in dataclasses.fields(planning.EmbeddingPlacement)
)


class ChangedSettingsError(RecsysError, ValueError):
  """A resume, evaluation or export would change settings that change the
  math of the run, or the files it read."""


class _Delegate(config_parser.ParserDelegate):
  """Keeps references and macros as their text: only compared, never called."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Text(f"@{scoped_configurable_name}{'()' if evaluate else ''}")

  def macro(self, macro_name):
    return _Text(f"%{macro_name}")


class _Text(str):
  def __repr__(self):
    return str(self)


def bindings(config_text: str) -> dict[str, str]:
  """`{"scope/Configurable.param": repr(value)}` of an operative config."""
  out = {}
  for statement in config_parser.ConfigParser(config_text, _Delegate()):
    if isinstance(statement, config_parser.BindingStatement):
      scope = f"{statement.scope}/" if statement.scope else ""
      out[f"{scope}{statement.selector}.{statement.arg_name}"] = repr(
        statement.value
      )
  return out


def changed_settings(
  old_text: str, new_text: str
) -> list[tuple[str, str, str]]:
  """The math settings that differ: `[(key, old value, new value)]`, sorted.

  A parameter only one side binds counts when the other side configures the
  same configurable (a new default, a removed binding); a configurable used
  by one side only (another model class) shows as the reference that chose
  it (`train.model`).
  """
  old, new = bindings(old_text), bindings(new_text)
  configurables = lambda b: {k.rsplit(".", 1)[0] for k in b}  # noqa: E731
  old_confs, new_confs = configurables(old), configurables(new)
  changes = []
  for key in sorted(set(old) | set(new)):
    if key in EXECUTION_SETTINGS:
      continue
    configurable = key.rsplit(".", 1)[0]
    if configurable not in old_confs or configurable not in new_confs:
      continue
    before, after = old.get(key, "(unset)"), new.get(key, "(unset)")
    if before != after:
      changes.append((key, before, after))
  return changes


_REFERENCE = re.compile(r"@([A-Za-z_][\w./]*)")
_MACRO = re.compile(r"%([A-Za-z_][\w./]*)")
#: The `train` arguments that name the data sources.
DATA_ARGUMENTS = ("train.data", "train.eval_data")


def data_settings(config_text: str) -> set[str]:
  """The bindings of a config that decide the data: `train.data`,
  `train.eval_data`, every binding of the configurables they reference
  (transitively: `MovieLens.history = @UserHistory()` brings UserHistory),
  and the macros those bindings use (`MOVIELENS_DIR`)."""
  bound = bindings(config_text)
  by_configurable: dict[str, list[str]] = {}
  for key in bound:
    by_configurable.setdefault(key.rsplit(".", 1)[0], []).append(key)
  keys = set(DATA_ARGUMENTS)
  pending = [bound[k] for k in DATA_ARGUMENTS if k in bound]
  seen: set[str] = set()
  while pending:
    text = pending.pop()
    for macro in _MACRO.findall(text):
      keys.add(f"{macro}.")
    for name in _REFERENCE.findall(text):
      if name in seen:
        continue
      seen.add(name)
      for key in by_configurable.get(name, []):
        keys.add(key)
        pending.append(bound[key])
  return keys


def numbered_configs(model_dir: str) -> list[str]:
  """The kept configs of a model dir, oldest first."""
  paths = glob.glob(
    os.path.join(model_dir, CONFIGS_DIR, "operative_config-*.gin")
  )
  numbered = {}
  for path in paths:
    m = re.search(r"-(\d+)\.gin$", path)
    if m:
      numbered[path] = int(m.group(1))
  return sorted(numbered, key=numbered.__getitem__)


def run_lengths(model_dir: str) -> list[tuple[int, int]]:
  """`(first step, train.train_steps)` of each run kept in a model dir,
  oldest first: its numbered config's length and the step its numbered
  input record (`input_files-<k>.json`) says it started from. A run whose
  length or first step is not recorded (an older run folder) is left out;
  the first run starts at step 0."""
  runs = []
  for index, path in enumerate(numbered_configs(model_dir)):
    with open(path, encoding="utf-8") as f:
      bound = bindings(f.read())
    steps = bound.get("train.train_steps", "")
    if steps.startswith("%"):  # a macro: its value is bound by its name
      steps = bound.get(f"{steps[1:]}.", "")
    record = path[: -len(".gin")].replace("operative_config-", "input_files-")
    try:
      with open(record + ".json", encoding="utf-8") as f:
        first = int(json.load(f)["step"])
    except (OSError, ValueError, KeyError, TypeError):
      if index:
        continue
      first = 0
    try:
      runs.append((first, int(steps)))
    except ValueError:
      continue
  return runs


def next_config_path(model_dir: str) -> str:
  """Where this run keeps its config: `configs/operative_config-<k+1>.gin`."""
  kept = numbered_configs(model_dir)
  m = re.search(r"-(\d+)\.gin$", kept[-1]) if kept else None
  k = int(m.group(1)) if m else 0
  return os.path.join(model_dir, CONFIGS_DIR, f"operative_config-{k + 1}.gin")
