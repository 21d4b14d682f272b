"""Backends declare their constructor options; the trainer checks them."""

import inspect

import pytest
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import base, registry

E = tf.tpu.experimental.embedding


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
  layouts or reading their vocabularies: never a `train.backend_options`
  key) is a declared option."""
  cls = registry.get(name)
  planned = {"layouts"} if registry.takes_layouts(cls) else set()
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


@pytest.mark.parametrize("name", ["tensorcore", "serving"])
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_restore_only_takes_true_or_false_only(name, value):
  """A truthy string is no yes: refused before anything is built."""
  table = E.TableConfig(10, 4, name="t")
  with pytest.raises(base.UnsupportedConfigError, match="restore_only="):
    registry.construct(
      name, {"f": E.FeatureConfig(table)}, E.SGD(0.1), None, restore_only=value
    )


def test_a_restore_only_backend_refuses_to_train():
  """Its tables have no slots: training it is refused, not run without."""
  table = E.TableConfig(10, 4, name="t")
  emb = registry.construct(
    "tensorcore",
    {"f": E.FeatureConfig(table)},
    E.Adagrad(0.1),
    None,
    restore_only=True,
  )
  emb.build()
  assert emb.lookup_only and not emb.slot_variables()["t"]
  acts = emb.lookup({"f": tf.constant([1, 2])}, training=True)
  with pytest.raises(base.UnsupportedConfigError, match="cannot train"):
    emb.apply_gradients({"f": tf.ones_like(acts["f"])})
