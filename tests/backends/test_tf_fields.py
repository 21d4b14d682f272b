"""No field of TF's embedding configuration is accepted and ignored.

`backends.tf_fields` lists what each field of the installed TF's
`TableConfig`, `FeatureConfig`, `QuantizationConfig` and optimizers does
here; this test enumerates the classes' fields, so a field a new TF adds
fails until it is placed. The fields refused somewhere are refused by name
(the honoured ones are checked against NumPy elsewhere: the conformance
suite's `quantization` check, the optimizer cases, the lookups).
"""

import inspect

import pytest
import tensorflow as tf

from backends import base, tf_fields
from backends.mid_level.serving import ServingEmbedding
from backends.mid_level.tpu_embedding_v0 import TPUEmbeddingV0Backend
from backends.tensorcore.backend import TensorCoreEmbedding
from tests.backends.test_selection import fake_tpu_strategy

E = tf.tpu.experimental.embedding
CLASSES = {
  cls.__name__: cls
  for cls in (
    E.TableConfig,
    E.FeatureConfig,
    E.QuantizationConfig,
    E.SGD,
    E.Adagrad,
    E.AdagradMomentum,
    E.Adam,
    E.FTRL,
  )
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_field_of_tfs_class_is_placed(name):
  fields = [
    p
    for p in inspect.signature(CLASSES[name].__init__).parameters
    if p != "self"
  ]
  placed = tf_fields.FIELDS[name]
  assert not set(fields) - set(placed), (
    f"TF's {name} has fields {sorted(set(fields) - set(placed))} that "
    "backends/tf_fields.py does not place: honour or refuse them."
  )
  assert not set(placed) - set(fields), f"{name}: stale entries"


def _config(**table_kwargs):
  table = E.TableConfig(11, 5, name="items", **table_kwargs)
  return {"item": E.FeatureConfig(table)}


@pytest.mark.parametrize(
  "kwargs,named",
  [
    ({"layout": object()}, "TableConfig.layout"),
    ({"dtype": tf.int32}, "TableConfig.dtype=int32"),
    (
      {"quantization_config": E.QuantizationConfig(4, 0.5, 0.5)},
      "lower must be below upper",
    ),
    (
      {"quantization_config": E.QuantizationConfig(4, -float("inf"), 1.0)},
      "finite",
    ),
  ],
  ids=["layout", "dtype", "empty-range", "infinite-bound"],
)
@pytest.mark.parametrize("backend", [TensorCoreEmbedding, ServingEmbedding])
def test_fields_a_backend_cannot_honour_are_refused_by_name(
  backend, kwargs, named
):
  with pytest.raises(base.UnsupportedConfigError, match="table 'items'") as e:
    backend(_config(**kwargs), E.SGD(0.1))
  assert named in str(e.value)


def test_tfs_v0_refuses_simulated_quantization():
  config = _config(quantization_config=E.QuantizationConfig(4, -1.0, 1.0))
  with pytest.raises(base.UnsupportedConfigError) as e:
    TPUEmbeddingV0Backend(
      config, E.SGD(0.1), strategy=fake_tpu_strategy("UNSUPPORTED")
    )
  assert "'items'" in str(e.value) and "quantization_config" in str(e.value)
