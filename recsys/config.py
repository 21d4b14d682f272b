"""Gin plumbing: registers TF/Keras classes with gin and parses gin files.

This is the ONE module that makes classes we do not own configurable (`import
gin.tf` is broken on TF 2.21). Our own classes carry `@gin.register` at their
definition. Names in gin files:

  embedding.TableConfig, embedding.FeatureConfig,
  embedding.SGD, embedding.Adagrad, embedding.AdagradMomentum, embedding.Adam,
  embedding.FTRL                       (tf.tpu.experimental.embedding.*)
  keras.optimizers.{SGD, Adam, AdamW, Adagrad, RMSprop, Ftrl, ...}
  keras.optimizers.schedules.{PolynomialDecay, CosineDecay, ...}
  keras.losses.{BinaryCrossentropy, MeanSquaredError, ...}
  keras.initializers.{TruncatedNormal, RandomUniform, ...}

Example:
  >>> from recsys import config
  >>> config.parse(["experiments/synthetic_dlrm.gin"],
  ...              ["train.train_steps = 10"])
"""

import contextlib
import importlib
import inspect
import logging
import os
import pkgutil
import re
import tokenize
from collections.abc import Callable, Sequence
from typing import Any

import gin

from backends import suggest as suggest_lib
from backends.vocabulary import hashed as vocabulary_hashed
from backends.vocabulary import policy as vocabulary_policy
from recsys import experiments_catalog, ranges
from recsys import features as features_lib
from recsys._keras import keras, tf
from recsys.errors import RecsysError, SettingsError
from recsys.gin_config import compat as gin_compat
from recsys.gin_config import range_check as gin_range_check

log = logging.getLogger("recsys.config")

_embedding = tf.tpu.experimental.embedding

_EXTERNAL = {
  # A dynamic-vocabulary table's policy (`EmbeddingPlacement.vocabularies`).
  "vocabulary": {
    "DynamicVocabulary": vocabulary_policy.DynamicVocabulary,
    "HashedIds": vocabulary_hashed.HashedIds,
  },
  "embedding": {
    "TableConfig": _embedding.TableConfig,
    "FeatureConfig": _embedding.FeatureConfig,
    **features_lib.EMBEDDING_OPTIMIZERS,
  },
  "keras.optimizers": {
    name: getattr(keras.optimizers, name)
    for name in (
      "SGD",
      "Adam",
      "AdamW",
      "Adagrad",
      "Adamax",
      "Adadelta",
      "Nadam",
      "RMSprop",
      "Ftrl",
      "Lion",
    )
    if hasattr(keras.optimizers, name)
  },
  "keras.optimizers.legacy": {
    name: getattr(keras.optimizers.legacy, name)
    for name in ("SGD", "Adam", "Adagrad", "RMSprop", "Ftrl")
    if hasattr(keras.optimizers.legacy, name)
  },
  "keras.optimizers.schedules": {
    name: getattr(keras.optimizers.schedules, name)
    for name in (
      "PolynomialDecay",
      "ExponentialDecay",
      "CosineDecay",
      "CosineDecayRestarts",
      "PiecewiseConstantDecay",
      "InverseTimeDecay",
    )
  },
  "keras.losses": {
    name: getattr(keras.losses, name)
    for name in (
      "BinaryCrossentropy",
      "MeanSquaredError",
      "CategoricalCrossentropy",
      "Huber",
      "MeanAbsoluteError",
    )
  },
  "keras.initializers": {
    name: getattr(keras.initializers, name)
    for name in (
      "TruncatedNormal",
      "RandomNormal",
      "RandomUniform",
      "GlorotUniform",
      "GlorotNormal",
      "HeNormal",
      "HeUniform",
      "Zeros",
      "Constant",
      "VarianceScaling",
    )
  },
  "keras.regularizers": {
    name: getattr(keras.regularizers, name) for name in ("L1", "L2", "L1L2")
  },
  "keras.metrics": {
    name: getattr(keras.metrics, name)
    for name in (
      "AUC",
      "BinaryAccuracy",
      "BinaryCrossentropy",
      "RootMeanSquaredError",
      "MeanSquaredError",
    )
  },
}

#: The gin modules of the TF/Keras classes above ("embedding", ...).
EXTERNAL_MODULES = tuple(_EXTERNAL)


def _range_of(spec: Any) -> ranges.Spec:
  """A `backends.vocabulary.policy` spec as the `recsys.ranges` one that
  takes the same values (checked before TensorFlow starts)."""
  if isinstance(spec, vocabulary_policy.Int):
    within = ranges.Int(spec.low, spec.high, note=spec.note)
    if not spec.also:
      return within
    return ranges.AnyOf((within, ranges.Choice(spec.also)), note=spec.note)
  if isinstance(spec, vocabulary_policy.Probability):
    return ranges.Real(0, 1, lo_open=True, note=spec.note)
  return ranges.Choice(tuple(m.value for m in spec.kind), note=spec.note)


#: A learning rate bound in gin: a number >= 0 (0 freezes what it trains);
#: a schedule is a reference (`@WarmupPolyDecay()`), checked when built.
_RATE = ranges.Real(0, note="0: frozen")
#: What TensorFlow and Keras take silently that recsys refuses: their
#: classes check other arguments themselves (`refused_arguments`), not
#: these (a negative learning rate trained uphill). Checked as the gin
#: files' values are, before TF starts (`recsys.gin_config.names.RANGES`).
EXTERNAL_RANGES: dict[str, dict[str, ranges.Spec]] = {
  **{
    f"embedding.{name}": {
      "learning_rate": _RATE,
      "weight_decay_factor": ranges.Real(0, optional=True),
    }
    for name in features_lib.EMBEDDING_OPTIMIZERS
  },
  **{
    f"{module}.{name}": {"learning_rate": _RATE}
    for module in ("keras.optimizers", "keras.optimizers.legacy")
    for name in _EXTERNAL[module]
  },
  **{
    f"keras.initializers.{name}": {"stddev": ranges.Real(0, lo_open=True)}
    for name in ("RandomNormal", "TruncatedNormal")
  },
  # Declared next to its fields (`backends.vocabulary.policy`), in the
  # floor's own spec types: the same ranges in `recsys.ranges` terms.
  "vocabulary.DynamicVocabulary": {
    name: _range_of(spec) for name, spec in vocabulary_policy.specs().items()
  },
  "vocabulary.HashedIds": {"seed": ranges.Int(-(2**63))},
}

# Modules whose import registers our own classes (`@gin.register`). Missing
# modules are tolerated so that one broken or absent part does not hide the
# others; `register_all()` logs what it could not import.
_OWN_MODULES = (
  "recsys.features",
  "recsys.planning",  # EmbeddingPlacement
  "recsys.run",  # train (recsys.run.configured), the schedules
  "recsys.models",
  "recsys.models.retrieval",  # TwoTower, ImplicitALS
  "recsys.data",
)

_registered = False


class GinConfigError(SettingsError):
  """A gin file or binding is invalid; the message names the file and line."""


class RefusedArgumentsError(GinConfigError):
  """A TensorFlow or Keras class gin called refused the arguments the gin
  bindings gave it (exit status 2); the message is one line."""


def refused_arguments(error: BaseException) -> RefusedArgumentsError | None:
  """`error` as a settings error when it is a TensorFlow or Keras class's
  refusal of its gin-bound arguments (`embedding.Adagrad` with
  `initial_accumulator_value = -1.0`, `keras.optimizers.SGD` with
  `momentum = 5.0`): TF validates its own classes' arguments, and such an
  error, raised where gin builds the class, is the settings' and not the
  run's. None for any other error."""
  found = gin_compat.refused_by_external(error)
  if found is None:
    return None
  selector, message = found
  refused = RefusedArgumentsError(
    f"{selector}: TensorFlow refused the arguments the gin bindings give it "
    f"({message.rstrip('.')}); fix {selector}.<parameter> in the gin files "
    "or --gin_bindings."
  )
  refused.__cause__ = error
  return refused


def register_external() -> None:
  """Registers the TF/Keras classes above with gin (idempotent)."""
  global _registered
  if _registered:
    return
  for module, classes in _EXTERNAL.items():
    for name, cls in classes.items():
      gin.external_configurable(cls, name=name, module=module)
  _registered = True


def register_all() -> list[str]:
  """Registers external classes and imports our gin-registered modules.

  Returns:
    The names of the modules that could not be imported (logged as warnings),
    so callers such as `recsys info` can report them.
  """
  register_external()
  missing = []
  for name in _OWN_MODULES:
    try:
      module = importlib.import_module(name)
    except ImportError as e:
      log.warning(
        "could not import %s (its gin names are unavailable): %s", name, e
      )
      missing.append(name)
      continue
    # Packages: import their public submodules too, so every @gin.register
    # runs even when the package's __init__ does not import them all.
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
      if info.name.startswith("_"):
        continue
      full = f"{name}.{info.name}"
      try:
        importlib.import_module(full)
      except ImportError as e:
        log.warning(
          "could not import %s (its gin names are unavailable): %s", full, e
        )
        missing.append(full)
  return missing


register_external()


def _gin_files_closure(files: Sequence[str]) -> list[str]:
  """The files and, recursively, the files they `include`, in parse order."""
  seen: list[str] = []

  def visit(path: str, base_dir: str | None) -> None:
    # The order gin (with experiments_catalog's reader) resolves includes in:
    # the including file's folder, as given, the search paths, experiments/.
    candidates = [path]
    if base_dir and not os.path.isabs(path):
      candidates.insert(0, os.path.join(base_dir, path))
    for prefix in gin_compat.search_paths():
      candidates.append(os.path.join(prefix, path))
    candidates.append(os.path.join(EXPERIMENTS_DIR, path))
    for candidate in candidates:
      if os.path.isfile(candidate):
        break
    else:
      return
    if candidate in seen:
      return
    seen.append(candidate)
    with open(candidate, encoding="utf-8") as f:
      for line in f:
        m = re.match(r"\s*include\s+['\"]([^'\"]+)['\"]", line)
        if m:
          visit(m.group(1), os.path.dirname(candidate))

  for path in files:
    visit(path, None)
  return seen


def locate(name: str, files: Sequence[str]) -> list[str]:
  """`file:line: text` for each line of `files` (and includes) naming `name`.

  Args:
    name: a macro (`DATA_DIR`), a configurable (`train`) or a binding key
      (`train.data`).
    files: gin files as given on the command line.
  """
  hits = []
  pattern = re.compile(r"(?<![\w.])%?" + re.escape(name) + r"(?![\w])")
  for path in _gin_files_closure(files):
    with open(path, encoding="utf-8") as f:
      for lineno, line in enumerate(f, 1):
        code = line.split("#", 1)[0]
        if pattern.search(code):
          hits.append(f"{path}:{lineno}: {line.strip()}")
  return hits


def _registered_names() -> list[str]:
  """Every name a gin file may use for a registered configurable.

  Gin matches selectors by their innermost components, so
  `recsys.models.dlrm.DLRM` is also `dlrm.DLRM` and `DLRM`.
  """
  names: set[str] = set()
  for selector in gin_compat.registered_selectors():
    parts = selector.split(".")
    names.update(".".join(parts[i:]) for i in range(len(parts)))
  return sorted(names)


def _parameters(selector: str) -> list[str] | None:
  """The parameter names of the configurable `selector`, or None if unknown."""
  target = gin_compat.find_configurable(selector)
  if target is None:
    return None
  if inspect.isclass(target):
    target = target.__init__
  try:
    params = inspect.signature(target).parameters.values()
  except (TypeError, ValueError):
    return None
  return [
    p.name
    for p in params
    if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
  ]


def suggest(message: str) -> str:
  """A "did you mean" hint for gin's unknown-name errors ('' if none).

  Args:
    message: gin's error message, e.g. "No configurable matching reference
      '@embedding.Adagard()'." or "Configurable 'train' doesn't have a
      parameter named 'backned'."

  Returns:
    One line naming the closest registered configurables or parameters, or
    the valid parameters when none is close; '' for other messages.
  """
  name = gin_compat.unknown_name(message)
  if name:
    close = suggest_lib.closest(
      name, [n for n in _registered_names() if n.count(".") == name.count(".")]
    )
    if close:
      return "Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return (
      "Registered names include the classes in recsys.config's module "
      "docstring and @gin.register classes (e.g. 'DLRM', "
      "'SyntheticCTR', 'EmbeddingSettings')."
    )
  param = gin_compat.unknown_parameter(message)
  if param:
    configurable, parameter = param
    params = _parameters(configurable)
    if params is None:
      return ""
    close = suggest_lib.closest(parameter, params)
    hint = (
      "Did you mean " + " or ".join(f"'{c}'" for c in close) + "? "
      if close
      else ""
    )
    return f"{hint}'{configurable}' takes: {', '.join(params)}."
  return ""


#: The "Found in:" lines an error shows at most.
_FOUND_IN_SHOWN = 5


def explain(
  error: Exception, files: Sequence[str], bindings: Sequence[str] = ()
) -> str:
  """Gin's message for `error`, plus a suggestion and the gin files/lines."""
  message = str(error)
  hint = suggest(message)
  if hint:
    first, _, rest = message.partition("\n")
    message = first + " " + hint + ("\n" + rest if rest else "")
  # An unknown parameter is found where it is bound (not every line naming
  # its configurable: 20 lines of `train` hid the suggestion).
  param = gin_compat.unknown_parameter(message)
  names = [".".join(param)] if param else gin_compat.names_in_message(message)
  lines = list(
    dict.fromkeys(hit for name in names for hit in locate(name, files))
  )
  if len(lines) > _FOUND_IN_SHOWN:
    more = len(lines) - _FOUND_IN_SHOWN
    lines = lines[:_FOUND_IN_SHOWN] + [f"... and {more} more"]
  parts = [message.rstrip()]
  if not gin_compat.names_location(message):
    if lines:
      parts.append("Found in:\n  " + "\n  ".join(lines))
    parts.append(
      "Gin files: "
      + (", ".join(files) or "(none)")
      + ("; bindings: " + "; ".join(bindings) if bindings else "")
    )
    if "REQUIRED" in message or "Required" in message:
      parts.append(
        "Bind the missing value in a gin file or with "
        "--gin_bindings 'NAME = value'."
      )
  return "\n".join(parts)


#: The project's experiments folder; gin `include` paths may be relative to it.
EXPERIMENTS_DIR = experiments_catalog.EXPERIMENTS_DIR


def add_search_paths(files: Sequence[str]) -> None:
  """Lets `include` resolve relative to each file's folder and experiments/."""
  dirs = [os.path.dirname(os.path.abspath(p)) for p in files] + [
    EXPERIMENTS_DIR
  ]
  # gin keeps search paths for the whole process; start from its default so
  # an `include` never resolves in the folder of an earlier parse's files.
  gin_compat.reset_search_paths()
  for d in dirs:
    gin_compat.append_search_path(d)


class _DropPathNotFound(logging.Filter):
  """Drops gin's "Path not found" logs for search-path misses."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = str(record.msg)
    return not (
      message.startswith("Path not found")
      or message.startswith("system_path_file_exists")
    )


@contextlib.contextmanager
def _quiet_include_search():
  # gin tries every search path for each include and logs each miss at
  # ERROR level on the root logger; a real miss still raises an IOError.
  root, drop = logging.getLogger(), _DropPathNotFound()
  root.addFilter(drop)
  try:
    yield
  finally:
    root.removeFilter(drop)


_MACRO_BINDING = re.compile(r"\s*([A-Za-z_]\w*)\s*=")
_MACRO_USE = re.compile(r"%([A-Za-z_]\w*)")


def check_macro_bindings(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Refuses a binding of a macro (`NAME = value`) that nothing uses.

  gin accepts such a binding silently, so a misspelt macro, or one a gin
  file no longer reads, would change nothing about the run while the user
  believes it did. Uses are `%NAME` in the files (with their includes) or in
  the other bindings, and `NAME = %gin.REQUIRED` (a file asking for it).

  Raises:
    GinConfigError: naming the binding, the closest macro in use and the
      macros the files use.
  """
  texts = []
  for path in _gin_files_closure(files):
    with open(path, encoding="utf-8") as f:
      texts += [line.split("#", 1)[0] for line in f]
  texts += list(bindings)
  used = {m for text in texts for m in _MACRO_USE.findall(text)} - {"gin"}
  used |= {  # `NAME = %gin.REQUIRED`: the file asks for the binding
    m.group(1)
    for text in texts
    if (m := _MACRO_BINDING.match(text)) and "%gin.REQUIRED" in text
  }
  for binding in bindings:
    match = _MACRO_BINDING.match(binding)
    if match and match.group(1) not in used:
      name = match.group(1)
      raise GinConfigError(
        f"the gin binding {binding.strip()!r} sets the macro {name}, but no "
        f"gin file or binding uses %{name}, so it would change nothing."
        f"{suggest_lib.did_you_mean(name, sorted(used))} The macros these "
        f"files use: {sorted(used) or 'none'}. To change a setting, bind its "
        "parameter (e.g. 'train.train_steps = 300')."
      )


def parse(
  files: Sequence[str] = (), bindings: Sequence[str] = (), finalize: bool = True
) -> None:
  """Parses gin files and bindings after registering every configurable.

  Args:
    files: gin file paths (later files override earlier ones).
    bindings: gin binding strings such as `"train.train_steps = 10"`.
    finalize: lock the config (checks `%gin.REQUIRED` macros).

  Raises:
    GinConfigError: a file is missing or does not parse, a name or parameter
      is unknown (the message suggests the closest registered ones), or a
      required macro is unbound, or a binding sets a macro nothing uses; the
      message is gin's plus the file and line. A selector that matches
      several configurables, in one line.
    ranges.SettingRangeError: a bound value outside its declared range
      (`recsys.gin_config.range_check`).
  """
  register_all()
  try:  # a path, or the name of a shipped experiment ("synthetic_dlrm.gin")
    files = [experiments_catalog.find_experiment(path) for path in files]
  except experiments_catalog.UnknownExperimentError as e:
    raise GinConfigError(f"{e} Pass an existing --gin_file.") from e
  add_search_paths(files)
  experiments_catalog.install_include_resolution()
  check_macro_bindings(files, bindings)
  try:
    with _quiet_include_search():
      gin.parse_config_files_and_bindings(
        list(files), list(bindings), finalize_config=finalize
      )
  except SyntaxError as e:
    raise GinConfigError(_syntax_message(e, files, bindings)) from e
  except tokenize.TokenError as e:
    raise GinConfigError(
      f"gin syntax error: {e.args[0]} (an unclosed bracket or quote) in the "
      f"gin files {list(files)} or bindings {list(bindings)}; check that "
      "every (, [, { and quote is closed."
    ) from e
  except KeyError as e:  # gin's refusal of an ambiguous selector
    raise GinConfigError(_ambiguous_message(e)) from e
  except (OSError, ValueError, TypeError, RuntimeError) as e:
    raise GinConfigError(explain(e, files, bindings)) from e
  # Values out of their declared ranges, as `recsys` checks them before TF
  # starts: here for every caller, before anything is built.
  gin_range_check.check(files, bindings)


def _ambiguous_message(error: KeyError) -> str:
  """One line for gin's "Ambiguous selector" error: the selector, where it
  is and the configurables it matches, spelt in full."""
  found = gin_compat.ambiguous_selector(
    str(error.args[0] if error.args else error)
  )
  if found is None:
    return gin_compat.one_line(str(error))
  name, matches, where = found
  return (
    f"{where + ': ' if where else ''}'{name}' matches {len(matches)} "
    f"configurables; write the one you mean in full: "
    f"{', '.join(sorted(matches))}."
  )


def call(
  configurable: Callable[..., Any],
  files: Sequence[str] = (),
  bindings: Sequence[str] = (),
  **kwargs: Any,
) -> Any:
  """Calls a gin configurable; gin's own errors become `GinConfigError`.

  Gin checks some things only when a configurable is called (e.g. required
  bindings, `gin.REQUIRED` arguments). Those errors are told apart by where
  they were raised, not by their text: an error raised inside the
  configurable (e.g. a busy model dir whose message mentions gin) passes
  through unchanged.

  Args:
    configurable: the gin-configurable function, e.g.
      `recsys.run.configured.configured_run` (gin's `train`).
    files: the gin files parsed (named in the error).
    bindings: the gin bindings parsed (named in the error).
    **kwargs: arguments for `configurable`.

  Raises:
    GinConfigError: gin refused the call; the message names files and lines.
  """
  try:
    return configurable(**kwargs)
  except RuntimeError as e:
    if isinstance(e, RecsysError) or not gin_compat.raised_by_gin(e):
      raise
    raise GinConfigError(explain(e, files, bindings)) from e


def value(binding: str) -> Any:
  """The value `binding` (e.g. "train.backend") has in the parsed config.

  References are evaluated as gin would (`@X()` called); None if unbound.
  """
  try:
    return gin_compat.evaluate(gin.query_parameter(binding))
  except ValueError:
    return None


def _syntax_message(
  error: SyntaxError, files: Sequence[str], bindings: Sequence[str]
) -> str:
  """`file:line:col: gin syntax error: ...` with the offending line."""
  where = error.filename or "<bindings>"
  if where and not os.path.isabs(where):  # gin names included files as given
    for path in _gin_files_closure(files):
      if os.path.basename(path) == os.path.basename(where):
        where = path
        break
  text = (error.text or "").rstrip("\n")
  pointer = (" " * (max(error.offset or 1, 1) - 1) + "^") if text else ""
  lines = [
    f"{where}:{error.lineno}:{error.offset}: gin syntax error: "
    f"{error.msg} (an unclosed quote or bracket, a missing '=' or "
    "'@'?)"
  ]
  if text:
    lines += ["    " + text, "    " + pointer]
  lines.append(
    "Gin files: "
    + (", ".join(files) or "(none)")
    + ("; bindings: " + "; ".join(bindings) if bindings else "")
  )
  return "\n".join(lines)


__all__ = [
  "GinConfigError",
  "call",
  "explain",
  "locate",
  "parse",
  "register_all",
  "register_external",
  "suggest",
  "value",
]
