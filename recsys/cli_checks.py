"""What `recsys` checks before TensorFlow is imported: files, names, flags.

Importing TensorFlow and listing its devices takes 6-10 s; a misspelt
`--gin_file`, a `--model_dir` that holds no run, a misspelt or ambiguous
gin name (`recsys.gin_config.precheck`), a gin-bound value outside its declared
range (`recsys.gin_config.range_check`), a gin binding nothing in the run reads
(`recsys.gin_config.unread`) or `recsys export --k` for a ranking model must not
cost that. These checks read files only (gin's parser, no TensorFlow) and
fail with the exit status the command would give after TF's start-up.

Example:
  >>> check("evaluate", gin_files=[], model_dir="runs/dmeo")
  Traceback (most recent call last):
  ModelDirNotFoundError: model dir 'runs/dmeo' does not exist ...
"""

import os
from collections.abc import Sequence

from recsys import experiments_catalog
from recsys.errors import RecsysError, SettingsError
from recsys.gin_config import precheck as gin_precheck
from recsys.gin_config import range_check as gin_range_check
from recsys.gin_config import unread as gin_unread

#: A run's config in its model dir (`run_dir.OPERATIVE_CONFIG_FILE`, named
#: here because `recsys.model_dir` imports TensorFlow; a test keeps both
#: the same).
OPERATIVE_CONFIG_FILE = "operative_config.gin"

#: The commands that read a run from --model_dir (and never create one).
READS_A_RUN = ("evaluate", "export")


class GinFileNotFoundError(SettingsError, FileNotFoundError):
  """A --gin_file is neither a file nor a shipped experiment (exit 2, as
  every gin configuration error)."""


class ModelDirNotFoundError(RecsysError, FileNotFoundError):
  """`recsys evaluate` or `export` names a model dir that holds no run."""


class TopKForRankingError(SettingsError, ValueError):
  """`recsys export --k` for a ranking model, whose signatures return one
  score per example (exit status 2, as the export's own refusal)."""


def check(
  command: str,
  gin_files: Sequence[str],
  model_dir: str | None,
  gin_bindings: Sequence[str] = (),
  export_k: int | None = None,
  allow_unused_bindings: bool = False,
) -> list[str]:
  """Refuses what `command` cannot use, before TF starts.

  Args:
    command: the subcommand ("train", "evaluate", ...).
    gin_files: the --gin_file values, as given.
    model_dir: --model_dir (None: the command takes none).
    gin_bindings: the --gin_bindings values.
    export_k: `recsys export --k` (None: not given).
    allow_unused_bindings: `--allow_unused_bindings`: gin bindings nothing
      reads are warned about, not refused.

  Returns:
    Warnings for the command to show (the unread bindings, allowed).

  Raises:
    GinFileNotFoundError: a gin file is missing; lists the shipped ones.
    ModelDirNotFoundError: evaluate/export: the model dir does not exist,
      or, without --gin_file, holds no operative config to read.
    gin_precheck.UnknownGinNameError: a misspelt configurable, reference
      or parameter, with where it is and the closest names; an ambiguous
      name, with the ones it matches.
    ranges.SettingRangeError: a gin-bound value outside its declared range.
    gin_unread.UnreadGinBindingError: a gin binding nothing in the run
      reads (unless allowed).
    TopKForRankingError: `--k` for a ranking model.
  """
  _check_files(command, gin_files, model_dir)
  files = list(gin_files)
  if not files and command in READS_A_RUN and model_dir is not None:
    files = [os.path.join(model_dir, OPERATIVE_CONFIG_FILE)]
  warnings = []
  if files or gin_bindings:
    gin_precheck.check(files, gin_bindings)
    gin_range_check.check(files, gin_bindings)
    if allow_unused_bindings:
      unread = gin_unread.problems(files, gin_bindings)
      if unread:
        warnings.append(gin_unread.message(unread))
    else:
      gin_unread.check(files, gin_bindings)
  if export_k is not None:
    name, kind = gin_precheck.model_kind(files, gin_bindings)
    # The export's own words (recsys.serving.export.checked_k).
    if kind == "ranking":
      raise TopKForRankingError(
        f"export: k={export_k} applies to retrieval models (their top-k "
        f"signatures); {name} is a ranking model, whose signatures return "
        "one score per example: leave k out."
      )
  return warnings


def _check_files(
  command: str, gin_files: Sequence[str], model_dir: str | None
) -> None:
  """The gin files and the model dir exist (`check`)."""
  for path in gin_files:
    try:
      experiments_catalog.find_experiment(path)
    except experiments_catalog.UnknownExperimentError as e:
      raise GinFileNotFoundError(f"{e} Pass an existing --gin_file.") from e
  if command not in READS_A_RUN or model_dir is None:
    return
  if not os.path.isdir(model_dir):
    cwd = "" if os.path.isabs(model_dir) else f" (cwd: {os.getcwd()})"
    raise ModelDirNotFoundError(
      f"model dir {model_dir!r} does not exist{cwd}: point "
      "--model_dir at a folder written by `recsys train` (e.g. runs/demo "
      "after `make demo`), or train one first."
    )
  config = os.path.join(model_dir, OPERATIVE_CONFIG_FILE)
  if not gin_files and not os.path.isfile(config):
    raise ModelDirNotFoundError(
      f"{config} does not exist: pass --gin_file (the experiment's gin "
      "files) or point --model_dir at a directory written by `recsys "
      "train`."
    )
