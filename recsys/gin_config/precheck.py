"""Misspelt gin names, found before TensorFlow is imported.

Gin knows a configurable's parameters only once the module defining it is
imported, and recsys's modules import TensorFlow: a misspelt parameter
(`--gin_bindings 'train.train_stepz = 5'`) was reported after 15-19 s, in
27 lines, its "Did you mean" scrolled away by 20 "Found in:" lines. This
module reads the gin files (with their includes) and bindings with gin's
own parser, without running them, and checks each name against
`recsys.gin_config.names` (the registry, written down): an unknown
configurable or reference, or an unknown parameter of one of recsys's own
configurables, is reported in two lines, where it is and what was meant; a
selector that matches several configurables (`@SGD()`: the embedding, Keras
and legacy Keras ones) in one line, listing them (gin's own refusal was a
24-line traceback). `Config` (the parsed bindings, where each is, whether
its line says `# optional`) is what `recsys.gin_config.range_check` and
`recsys.gin_config.unread` read too.

What it cannot judge it leaves to gin: files that `import` modules (they
may register names), parameters of TensorFlow's and Keras's classes (they
follow the installed TensorFlow).

Example:
  >>> check(["experiments/synthetic_dlrm.gin"], ["train.train_stepz = 5"])
  Traceback (most recent call last):
  UnknownGinNameError: --gin_bindings 'train.train_stepz = 5': 'train' has
  no parameter 'train_stepz'; did you mean 'train_steps'? ...
"""

import dataclasses
import functools
import os
import re
import tokenize
from collections.abc import Iterator, Sequence
from typing import Any

import gin  # noqa: F401  (gin.config_parser needs gin's package set up)
from gin import config_parser

from backends import suggest
from recsys import experiments_catalog
from recsys.errors import SettingsError
from recsys.gin_config import compat as gin_compat
from recsys.gin_config import names as gin_names


class UnknownGinNameError(SettingsError):
  """A gin file or binding names a configurable or parameter that does not
  exist, or a selector that matches several (exit status 2, as every gin
  configuration error)."""


#: The comment that marks bindings a run may leave unread on purpose
#: (`recsys.gin_config.unread`), e.g. a base file's learning rate of an
#: optimizer only some experiments choose: `# optional: why` at the end of a
#: binding's line, or on a line of its own above a group of bindings (all of
#: them, up to the next blank line).
OPTIONAL_MARKER = re.compile(r"#\s*optional\b", re.IGNORECASE)


def _optional_lines(lines: Sequence[str]) -> set[int]:
  """The line numbers (from 1) the `OPTIONAL_MARKER`s of a file cover."""
  covered, block = set(), False
  for number, line in enumerate(lines, 1):
    text = line.strip()
    if not text:
      block = False
    elif text.startswith("#"):
      block = block or bool(OPTIONAL_MARKER.match(text))
    if block or OPTIONAL_MARKER.search(line):
      covered.add(number)
  return covered


@dataclasses.dataclass(frozen=True)
class Binding:
  """One `scope/Selector.param = value` statement and where it is (a
  macro `NAME = value` has selector NAME and no param)."""

  scope: str
  selector: str
  param: str
  value: Any
  where: str  # "file.gin:3" or "--gin_bindings '...'"
  optional: bool = False  # its line is marked `# optional`

  @property
  def key(self) -> str:
    """`scope/selector.param` as written."""
    scope = f"{self.scope}/" if self.scope else ""
    return f"{scope}{self.selector}.{self.param}"


class Reference(str):
  """A `@scope/Name` or `@scope/Name()` in a value, kept as its name."""


class Macro(str):
  """A `%NAME` in a value, kept as its text."""


class _Delegate(config_parser.ParserDelegate):
  """Keeps references as `Reference` and macros as `Macro`: nothing runs."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return Reference(scoped_configurable_name)

  def macro(self, macro_name):
    return Macro(f"%{macro_name}")


def _resolve_include(path: str, including: str) -> str | None:
  """Where gin (with `experiments_catalog`'s reader) finds an include: the
  including file's folder, as given, the search paths, experiments/."""
  candidates = [path]
  if not os.path.isabs(path):
    candidates.insert(0, os.path.join(os.path.dirname(including), path))
  candidates += [os.path.join(p, path) for p in gin_compat.search_paths()]
  candidates.append(os.path.join(experiments_catalog.EXPERIMENTS_DIR, path))
  return next((c for c in candidates if os.path.isfile(c)), None)


@functools.lru_cache(maxsize=256)
def _statements(text: str) -> tuple[Any, ...]:
  """Gin's statements of `text` (none when it does not parse: gin reports
  that, with its line, after start-up); parsed once per text, as the
  checks before TF each read the same files."""
  try:
    return tuple(config_parser.ConfigParser(text, _Delegate()))
  except (SyntaxError, ValueError, TypeError, tokenize.TokenError):
    return ()


class Config:
  """The bindings of gin files and binding strings, in order, and whether
  any file imports a module (which may register names this check cannot
  know)."""

  def __init__(self, files: Sequence[str], bindings: Sequence[str]):
    self.bindings: list[Binding] = []
    self.imports = False
    seen: set[str] = set()
    for path in files:
      try:
        self._read(experiments_catalog.find_experiment(path), seen)
      except experiments_catalog.UnknownExperimentError:
        continue  # `cli_checks` reports a missing file
    for text in bindings:
      self._add(
        _statements(text), f"--gin_bindings {text.strip()!r}", None, [text]
      )

  def _read(self, path: str, seen: set[str]) -> None:
    real = os.path.realpath(path)
    if real in seen:
      return
    seen.add(real)
    try:
      with open(path, encoding="utf-8") as f:
        text = f.read()
    except OSError:
      return
    self._add(_statements(text), path, seen, text.splitlines())

  def _add(
    self,
    statements: Sequence[Any],
    where: str,
    seen: set[str] | None,
    lines: Sequence[str] = (),
  ) -> None:
    optional = _optional_lines(lines)
    for statement in statements:
      if isinstance(statement, config_parser.ImportStatement):
        self.imports = True
      elif isinstance(statement, config_parser.IncludeStatement):
        found = _resolve_include(statement.filename, where)
        if found is not None and seen is not None:
          self._read(found, seen)
      elif isinstance(statement, config_parser.BindingStatement):
        number = statement.location.line_num
        line = "" if seen is None else f":{number}"
        self.bindings.append(
          Binding(
            statement.scope,
            statement.selector,
            statement.arg_name,
            statement.value,
            f"{where}{line}",
            number in optional,
          )
        )


def _names(selector: str) -> list[str]:
  """The names gin matches `selector` by: its innermost components."""
  parts = selector.split(".")
  return [".".join(parts[i:]) for i in range(len(parts))]


def known_names() -> dict[str, list[str]]:
  """Every name a selector may use -> the full selectors it matches (gin's
  rule: a full selector matches itself only): the written-down registry
  and whatever this process registered."""
  out: dict[str, list[str]] = {}
  fulls = list(gin_names.CONFIGURABLES) + [
    s
    for s in gin_compat.registered_selectors()
    if s not in gin_names.CONFIGURABLES
  ]
  for full in fulls:
    for name in _names(full):
      out.setdefault(name, []).append(full)
  for full in fulls:
    out[full] = [full]
  return out


def _found_in(value: Any, kind: type) -> Iterator[str]:
  """The `Reference`s or `Macro`s in a binding's value, nested too."""
  if isinstance(value, kind):
    yield str(value)
  elif isinstance(value, (list, tuple, set)):
    for item in value:
      yield from _found_in(item, kind)
  elif isinstance(value, dict):
    for item in list(value.keys()) + list(value.values()):
      yield from _found_in(item, kind)


def references(value: Any) -> list[str]:
  """The configurables a binding's value references (`scope/Name`)."""
  return list(_found_in(value, Reference))


def macros(value: Any) -> list[str]:
  """The macros a binding's value uses (their names, without `%`)."""
  return [m[1:] for m in _found_in(value, Macro)]


def _hint(name: str, candidates: Sequence[str]) -> str:
  """ "; did you mean 'a' or 'b'?" for the candidates close to `name`."""
  close = suggest.closest(name, candidates)
  return (
    "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    if close
    else ""
  )


def _unknown_name(name: str, known: dict[str, list[str]], where: str) -> str:
  hint = _hint(name, [n for n in known if n.count(".") == name.count(".")])
  return (
    f"{where}: no configurable named '{name}'{hint}\n"
    "`recsys experiments NAME` prints a shipped gin file that uses the names "
    "(the classes: recsys.config's module docstring, @gin.register classes)."
  )


def _ambiguous(name: str, matches: Sequence[str], binding: Binding) -> str:
  """One line: the name matches several configurables, spelt in full."""
  selects = name == binding.selector and binding.param
  spelt = [
    f"{m}.{binding.param}" if selects else f"@{m}()" for m in sorted(matches)
  ]
  return (
    f"{binding.where}: '{name}' matches {len(matches)} configurables; "
    f"write the one you mean in full: {', '.join(spelt)}."
  )


def problems(files: Sequence[str], bindings: Sequence[str]) -> list[str]:
  """What gin would refuse in `files` and `bindings`, in their order: an
  unknown name or parameter in two lines, an ambiguous name in one; []
  when nothing is sure to be wrong."""
  config = Config(files, bindings)
  known = known_names()
  found = []
  for binding in config.bindings:
    names = [(binding.selector, True)] if binding.param else []  # a macro
    names += [(r.rpartition("/")[2], False) for r in references(binding.value)]
    for name, selects in names:
      if name.startswith("gin."):
        continue
      matches = known.get(name)
      if not matches:
        if not config.imports:
          found.append(_unknown_name(name, known, binding.where))
        continue
      if len(matches) > 1:
        found.append(_ambiguous(name, matches, binding))
        continue
      if not selects:  # a reference
        continue
      params, _ = gin_names.CONFIGURABLES.get(matches[0], (None, ""))
      if params is not None and binding.param not in params:
        found.append(_unknown_parameter(binding, params))
  return found


def _unknown_parameter(binding: Binding, params: Sequence[str]) -> str:
  name = binding.selector
  hint = _hint(binding.param, list(params))
  return (
    f"{binding.where}: '{name}' has no parameter '{binding.param}'{hint}\n"
    f"'{name}' takes: {', '.join(params)}."
  )


def check(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Refuses misspelt gin names before TensorFlow is imported.

  Raises:
    UnknownGinNameError: the first problem (`problems`), in two lines.
  """
  found = problems(files, bindings)
  if found:
    raise UnknownGinNameError(found[0])


def bound_value(files: Sequence[str], bindings: Sequence[str], key: str) -> Any:
  """The value the last binding of `key` ("train.model") gives it, as
  parsed (a reference as its name); None when unbound."""
  selector, _, param = key.rpartition(".")
  value = None
  for binding in Config(files, bindings).bindings:
    if (
      binding.selector == selector
      and binding.param == param
      and not binding.scope
    ):
      value = binding.value
  return value


def model_kind(
  files: Sequence[str], bindings: Sequence[str]
) -> tuple[str, str]:
  """`(the model's class name, "ranking" / "retrieval" / "")` of the
  config's `train.model` ("" when unknown here)."""
  value = bound_value(files, bindings, "train.model")
  if not isinstance(value, Reference):
    return "", ""
  name = str(value).rpartition("/")[2]
  matches = known_names().get(name, [])
  if len(matches) != 1:
    return name, ""
  return name, gin_names.CONFIGURABLES.get(matches[0], (None, ""))[1]
