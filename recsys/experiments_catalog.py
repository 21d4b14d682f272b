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
from collections.abc import Iterator

import gin

EXPERIMENTS_DIR = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "experiments"
)


class UnknownExperimentError(FileNotFoundError):
  """A gin file that is neither a path nor a shipped experiment."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A shipped gin file: its name relative to experiments/ and first comment."""

  name: str
  path: str
  summary: str


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
  end = comment.find(". ")
  sentence = comment[: end + 1] if end >= 0 else comment
  return sentence if len(sentence) <= width else sentence[: width - 3] + "..."


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
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  folder = os.path.dirname(os.path.abspath(path))
  prefixes.insert(0, folder)
  try:
    with open(path, encoding="utf-8") as f:
      yield f
  finally:
    prefixes.pop(0)


def install_include_resolution() -> None:
  """Makes gin open files through `_open_with_own_folder_first` (idempotent)
  and search the shipped experiments after the current directory."""
  readers = gin.config._FILE_READERS  # pylint: disable=protected-access
  if not any(r is _open_with_own_folder_first for r, _ in readers):
    readers.insert(0, (_open_with_own_folder_first, os.path.isfile))
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  if EXPERIMENTS_DIR not in prefixes:
    prefixes.append(EXPERIMENTS_DIR)
