"""Gin-bound values outside their declared ranges, found before TF starts.

A value out of range used to be taken silently (`train.checkpoint_every =
-1`: the loop counted steps backwards forever) or failed late, after the
data was read and the tables built. Every recsys configurable declares
its parameters' ranges (`recsys.ranges`, written down in
`recsys.gin_config.names.RANGES`); this module checks the values the gin files
and bindings give them, as parsed (`recsys.gin_config.precheck.Config`), without
running anything: a literal, or a macro bound to one. A value gin
computes (`@total_train_steps()`) is checked when the configurable is
called.

Example:
  >>> check(["synthetic_dlrm.gin"], ["train.checkpoint_every = -1"])
  Traceback (most recent call last):
  SettingRangeError: --gin_bindings 'train.checkpoint_every = -1':
  train.checkpoint_every must be an integer >= 0 (0: only at the end), ...
"""

from collections.abc import Mapping, Sequence
from typing import Any

from recsys import ranges
from recsys.gin_config import compat as gin_compat
from recsys.gin_config import names as gin_names
from recsys.gin_config import precheck as gin_precheck

#: A value that is not a literal (it references or uses a macro that is
#: none): gin computes it, the configurable checks it when called.
_COMPUTED = object()


def specs_of(full_selector: str) -> Mapping[str, ranges.Spec]:
  """The declared ranges of a configurable's parameters: written down in
  `recsys.gin_config.names`, else (one this process registered, with TF) read
  from it; {} for TensorFlow's and Keras's classes."""
  if full_selector in gin_names.RANGES:
    return gin_names.RANGES[full_selector]
  target = gin_compat.find_configurable(full_selector)
  return ranges.declared(target) if target is not None else {}


def _literal(value: Any, macro_values: Mapping[str, Any], depth: int = 0):
  """`value` with its macros replaced by their literal values, or
  `_COMPUTED` when it holds a reference or a macro bound to none."""
  if isinstance(value, gin_precheck.Reference) or depth > 10:
    return _COMPUTED
  if isinstance(value, gin_precheck.Macro):
    name = value[1:]
    if name not in macro_values:
      return _COMPUTED
    return _literal(macro_values[name], macro_values, depth + 1)
  if isinstance(value, (list, tuple)):
    items = [_literal(v, macro_values, depth) for v in value]
    if any(v is _COMPUTED for v in items):
      return _COMPUTED
    return type(value)(items)
  if isinstance(value, dict):
    entries = {k: _literal(v, macro_values, depth) for k, v in value.items()}
    if any(v is _COMPUTED for v in entries.values()):
      return _COMPUTED
    return entries
  return value


def problems(files: Sequence[str], bindings: Sequence[str]) -> list[str]:
  """One line per gin binding whose value is outside its parameter's
  declared range (the last binding of each parameter: the one gin uses),
  in the order of the files and bindings."""
  config = gin_precheck.Config(files, bindings)
  known = gin_precheck.known_names()
  macro_values = {b.selector: b.value for b in config.bindings if not b.param}
  last: dict[tuple[str, str, str], gin_precheck.Binding] = {}
  for binding in config.bindings:
    matches = known.get(binding.selector, [])
    if binding.param and len(matches) == 1:
      last[(binding.scope, matches[0], binding.param)] = binding
  found = []
  for (_, full, param), binding in last.items():
    spec = specs_of(full).get(param)
    if spec is None:
      continue
    value = _literal(binding.value, macro_values)
    if value is not _COMPUTED and not spec.accepts(value):
      found.append(
        f"{binding.where}: {ranges.refusal(binding.key, spec, value)}"
      )
  return found


def check(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Refuses a gin-bound value outside its declared range.

  Raises:
    ranges.SettingRangeError: the first (`problems`), in one line.
  """
  found = problems(files, bindings)
  if found:
    raise ranges.SettingRangeError(found[0])
