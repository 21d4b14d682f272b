"""Backends declare their constructor options; the trainer checks them."""

import inspect

import pytest

from backends import registry


def _keyword_parameters(cls: type) -> set[str]:
  """Keyword options `cls(...)` accepts, following `**kwargs` up the MRO."""
  names: set[str] = set()
  for klass in cls.__mro__:
    init = klass.__dict__.get("__init__")
    if init is None:
      continue
    params = inspect.signature(init).parameters.values()
    names |= {p.name for p in params if p.kind == p.KEYWORD_ONLY}
    if not any(p.kind == p.VAR_KEYWORD for p in params):
      break
  return names


@pytest.mark.parametrize("name", sorted(registry._BUILTIN))  # pylint: disable=protected-access
def test_declared_options_are_the_constructors(name):
  """Every keyword but `layouts` (the planner's, for a backend built from
  layouts: never a `train.backend_options` key) is a declared option."""
  cls = registry.get(name)
  planned = {"layouts"} if cls.capabilities.layouts else set()
  assert set(cls.options) == _keyword_parameters(cls) - planned


def test_unknown_option_lists_the_declared_ones():
  with pytest.raises(
    registry.UnknownBackendOptionError,
    match=r"\['invalid_id'\] are not options of the 'tensorcore' backend; "
    r"it takes \['bag_widths', 'fused_kernels', 'invalid_ids', "
    r"'restore_only', 'rounding_seed', 'saturate_restores', 'static_shapes'\]",
  ):
    registry.check_options("tensorcore", {"invalid_id": "drop"})
  registry.check_options("tensorcore", {"invalid_ids": "drop"})
