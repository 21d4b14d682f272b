"""Every use of gin-config's internals, in one place, tested against gin.

Gin 0.5 has no public API for some things recsys needs: the registry of
configurables ("did you mean"), the search paths and file readers of
`include` (resolving includes relative to the including file), the text of
its errors (which name or parameter was unknown) and where its errors come
from (its own checks vs. errors raised inside a configurable). Everything
that depends on those details lives here, so a gin upgrade breaks one
module and `tests/training/test_gin_compat.py`, not the whole tree.

Example:
  >>> from recsys.gin_config import compat as gin_compat
  >>> gin_compat.unknown_name("No configurable matching '@Adagard()'.")
  'Adagard'
"""

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import gin

_config = gin.config

# -- the registry --------------------------------------------------------------


def registered_selectors() -> list[str]:
  """The full selectors (`module.Name`) of every registered configurable."""
  return [selector for selector, _ in _config._REGISTRY.items()]  # pylint: disable=protected-access


def find_configurable(selector: str) -> Callable[..., Any] | None:
  """The function or class registered as `selector` (None: not one)."""
  try:
    configurable = _config._REGISTRY.get_match(selector)  # pylint: disable=protected-access
  except ValueError:  # ambiguous selector
    return None
  return None if configurable is None else configurable.wrapped


def evaluate(value: Any) -> Any:
  """A parsed binding's value as gin passes it: `@X()` called, `@X` as is."""
  if isinstance(value, _config.ConfigurableReference):
    fn = value.scoped_configurable_fn
    return evaluate(fn()) if value.evaluate else fn
  return value


def referenced_configurable(
  binding: str,
) -> tuple[Callable[..., Any], dict[str, Any]] | None:
  """What `binding`'s `@X()` / `@X` names, and X's bindings, unevaluated.

  For a plan made without calling X (e.g. a data source whose files are not
  there yet): `(X, {parameter: value})`, where a value that is a reference
  or macro is left as gin parsed it (`evaluate` it, or skip it). None when
  the binding is unset or not a reference.
  """
  try:
    value = gin.query_parameter(binding)
  except ValueError:
    return None
  if not isinstance(value, _config.ConfigurableReference):
    return None
  target = value.configurable.wrapped
  return target, gin.get_bindings(target, resolve_references=False)


# -- include search paths and file readers -------------------------------------


def search_paths() -> list[str]:
  """Gin's search paths for `include` (a copy; the first is gin's '')."""
  return list(_config._LOCATION_PREFIXES)  # pylint: disable=protected-access


def reset_search_paths() -> None:
  """Drops every search path added since import (keeps gin's default '')."""
  del _config._LOCATION_PREFIXES[1:]  # pylint: disable=protected-access


def append_search_path(folder: str) -> None:
  """Adds `folder` as the last search path, unless it is one already."""
  if folder not in _config._LOCATION_PREFIXES:  # pylint: disable=protected-access
    gin.add_config_file_search_path(folder)


@contextlib.contextmanager
def searched_first(folder: str) -> Iterator[None]:
  """While open, `include` looks in `folder` before any other search path."""
  prefixes = _config._LOCATION_PREFIXES  # pylint: disable=protected-access
  prefixes.insert(0, folder)
  try:
    yield
  finally:
    prefixes.pop(0)


def install_file_reader(
  reader: Callable[[str], Any], exists: Callable[[str], bool]
) -> None:
  """Makes gin open config files with `reader` first (idempotent).

  `gin.register_file_reader` appends, after gin's own `open`, which would
  then always win; a reader that must see every file goes first.
  """
  readers = _config._FILE_READERS  # pylint: disable=protected-access
  if not any(r is reader for r, _ in readers):
    readers.insert(0, (reader, exists))


# -- gin's error messages ------------------------------------------------------

_UNKNOWN_NAME = re.compile(
  r"No configurable matching (?:reference )?'@?([\w.]+)"
)
_UNKNOWN_PARAMETER = re.compile(
  r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'"
)
_REQUIRED = re.compile(
  r"Required bindings for `([\w.]+)` not provided in config: \[([^\]]*)\]"
)


def unknown_name(message: str) -> str | None:
  """The configurable an "unknown name" error of gin names, else None."""
  m = _UNKNOWN_NAME.search(message)
  return m.group(1) if m else None


def unknown_parameter(message: str) -> tuple[str, str] | None:
  """`(configurable, parameter)` of an "unknown parameter" error, else None."""
  m = _UNKNOWN_PARAMETER.search(message)
  return (m.group(1), m.group(2)) if m else None


def missing_required(message: str) -> tuple[str, list[str]] | None:
  """`(configurable, [parameters])` of a "required bindings" error or None."""
  m = _REQUIRED.search(message)
  if not m:
    return None
  return m.group(1), [p.strip(" '") for p in m.group(2).split(",")]


def names_in_message(message: str) -> list[str]:
  """The bindings, macros and configurables a gin error message mentions."""
  required = missing_required(message)
  if required:
    name, params = required
    return [f"{name}.{p}" for p in params] + [name]
  names = re.findall(r"'([\w./]+?)(?:/(?:gin\.)?macro(?:\.value)?)?'", message)
  names += re.findall(r"^([\w.]+)/macro\.value", message)
  names += re.findall(r"`([\w.]+)`", message)
  return list(dict.fromkeys(names))


_AMBIGUOUS = re.compile(r"Ambiguous selector '([\w.]+)', matches \[([^\]]*)\]")
_LOCATION = re.compile(
  r"In (?:file \"?([^\"\n,]+)\"?, line (\d+)|bindings string line (\d+))"
)


def ambiguous_selector(message: str) -> tuple[str, list[str], str] | None:
  """`(selector, [full selectors it matches], where)` of gin's "Ambiguous
  selector" error (`where`: "file.gin:3", "--gin_bindings line 2" or ''),
  else None."""
  m = _AMBIGUOUS.search(message)
  if not m:
    return None
  matches = [s.strip(" '\"") for s in m.group(2).split(",") if s.strip()]
  where = ""
  loc = _LOCATION.search(message)
  if loc and loc.group(1):
    where = f"{loc.group(1)}:{loc.group(2)}"
  elif loc:
    where = f"--gin_bindings line {loc.group(3)}"
  return m.group(1), matches, where


def one_line(message: str) -> str:
  """A gin message's lines joined into one (location lines included)."""
  return " ".join(line.strip() for line in message.splitlines() if line.strip())


def names_location(message: str) -> bool:
  """Whether gin already put the file and line in `message`."""
  return "In file" in message


# -- where an error comes from -------------------------------------------------

_GIN_DIR = os.path.dirname(os.path.abspath(gin.__file__)) + os.sep


# Gin re-raises an error from inside a configurable with this line added to
# its message, e.g. "  In call to configurable 'train' (<function train at
# 0x7f...>)": a memory address, noise to a user reading the CLI's error.
_CALL_TRAIL = re.compile(
  r"\n?[ \t]*In call to configurable '[^']*' \(<[^\n]*>\)"
)


_CALLED = re.compile(
  r"In call to configurable '([^']*)' \((<class '([\w.]+)'>)\)"
)
#: The packages whose classes recsys registers with gin (`recsys.config`).
_EXTERNAL_PACKAGES = ("tensorflow.", "tf_keras.", "keras.")


def refused_by_external(error: BaseException) -> tuple[str, str] | None:
  """`(selector, message)` when a TensorFlow or Keras class gin called
  refused its arguments (a ValueError or TypeError raised in the call gin
  names first: the innermost); None otherwise. `selector` is the
  registered one (`embedding.Adagrad`), `message` the class's own, one
  line."""
  if not isinstance(error, (ValueError, TypeError)):
    return None
  called = _CALLED.search(str(error))
  if called is None or not called.group(3).startswith(_EXTERNAL_PACKAGES):
    return None
  name, shown = called.group(1), called.group(2)
  selector = next(
    (
      s
      for s in registered_selectors()
      if s.rpartition(".")[2] == name and repr(find_configurable(s)) == shown
    ),
    name,
  )
  text = without_call_trail(str(error.args[0] if error.args else error))
  return selector, one_line(text)


def without_call_trail(message: str) -> str:
  """`message` without the "In call to configurable ..." lines gin adds."""
  return _CALL_TRAIL.sub("", message)


def raised_by_gin(error: BaseException) -> bool:
  """Whether gin itself raised `error` (e.g. required bindings missing).

  Errors raised inside a configurable pass through gin's wrapper, which
  re-raises them with the configurable's name added; they were raised by
  our code: their innermost frame is not in the gin package.
  """
  tb, last = error.__traceback__, None
  while tb is not None:
    last, tb = tb, tb.tb_next
  return last is not None and os.path.abspath(
    last.tb_frame.f_code.co_filename
  ).startswith(_GIN_DIR)
