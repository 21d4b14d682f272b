"""The experiment gin files shipped in the package, and `include` resolution.

The repo's `experiments/` folder is the package's `recsys/experiments`
(a symlink in the repo, copied into the wheel as package data), so an
installed `recsys` can train, list and print them from any directory.

Gin resolves an `include` against its search paths only; recsys resolves it
relative to the including file first, then as given (the current
directory), then in the shipped experiments: a user's own gin file
elsewhere can `include 'synthetic_dlrm.gin'`, and a shipped file included by
absolute path still finds its own `include 'base.gin'`.

Example:
  >>> [e.name for e in list_experiments()][:2]
  ['base.gin', 'criteo_dcn.gin']
  >>> print(read_experiment("synthetic_dlrm.gin"))
"""

import contextlib
import dataclasses
import os
import re
import textwrap
from collections.abc import Iterator

from recsys.errors import SettingsError
from recsys.gin_config import compat as gin_compat

EXPERIMENTS_DIR = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "experiments"
)


class UnknownExperimentError(SettingsError, FileNotFoundError):
  """A gin file that is neither a path nor a shipped experiment."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A shipped gin file: its name relative to experiments/ and first comment."""

  name: str
  path: str
  summary: str


_SENTENCE_END = re.compile(r"(?<![.\s])\.(\s|$)")


def _summary(path: str, width: int = 90) -> str:
  """The opening comment's first sentence (what the file configures)."""
  words = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      text = line.strip()
      if not text.startswith("#"):
        break
      words += text.lstrip("# ").split()
  comment = " ".join(words)
  end = _SENTENCE_END.search(comment)  # not the dots of "day_0 .. day_22"
  sentence = comment[: end.start() + 1] if end else comment
  return textwrap.shorten(  # cut between whole words
    sentence, width, break_on_hyphens=False, placeholder=" ..."
  )


def list_experiments() -> list[Experiment]:
  """Every shipped gin file, sorted by name (`hardware/tpu.gin`, ...)."""
  out = []
  for root, _, files in os.walk(EXPERIMENTS_DIR, followlinks=True):
    for name in files:
      if name.endswith(".gin"):
        path = os.path.join(root, name)
        out.append(
          Experiment(
            os.path.relpath(path, EXPERIMENTS_DIR), path, _summary(path)
          )
        )
  return sorted(out, key=lambda e: (e.name.count(os.sep), e.name))


def find_experiment(name: str) -> str:
  """The path of a gin file given as a path or as a shipped experiment's name.

  Raises:
    UnknownExperimentError: neither; lists the shipped experiments.
  """
  if os.path.isfile(name):
    return name
  for candidate in (
    name,
    os.path.join(*name.split("/")[1:])
    if name.startswith("experiments/")
    else None,
  ):
    if candidate and os.path.isfile(os.path.join(EXPERIMENTS_DIR, candidate)):
      return os.path.join(EXPERIMENTS_DIR, candidate)
  names = ", ".join(e.name for e in list_experiments())
  raise UnknownExperimentError(
    f"gin file {name!r} does not exist (cwd: {os.getcwd()}) and is not a "
    f"shipped experiment; shipped: {names} (`recsys experiments` lists "
    "them, `recsys experiments NAME` prints one)."
  )


def read_experiment(name: str) -> str:
  """The text of a shipped experiment (or of any gin file path)."""
  with open(find_experiment(name), encoding="utf-8") as f:
    return f.read()


@contextlib.contextmanager
def _open_with_own_folder_first(path: str) -> Iterator:
  """Gin's file reader: while `path` is parsed (its includes included), its
  folder is searched first."""
  with gin_compat.searched_first(os.path.dirname(os.path.abspath(path))):
    with open(path, encoding="utf-8") as f:
      yield f


def install_include_resolution() -> None:
  """Makes gin open files through `_open_with_own_folder_first` (idempotent)
  and search the shipped experiments after the current directory."""
  gin_compat.install_file_reader(_open_with_own_folder_first, os.path.isfile)
  gin_compat.append_search_path(EXPERIMENTS_DIR)
