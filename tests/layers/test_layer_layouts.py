"""The Keras layer plans its tables as a run does (issue 53)."""

import pytest
import tensorflow as tf

from recsys import layers, planning
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding


def _config():
  return {
    "u": E.FeatureConfig(E.TableConfig(23, 7, name="users")),
    "i": E.FeatureConfig(E.TableConfig(11, 5, name="items")),
  }


def test_the_layer_holds_the_planned_layouts():
  strategy = mirrored_strategy(2)
  placement = planning.EmbeddingPlacement(
    tables={"users": "row_sharded"}, table_dtype={"items": "bfloat16"}
  )
  with strategy.scope():
    emb = layers.Embedding(
      _config(), "adagrad", backend="tensorcore", placement=placement
    )
  plan = planning.plan_memory(
    emb.embedding.feature_config,
    E.Adagrad(0.001),
    strategy,
    backend="tensorcore",
    placement=placement,
  )
  held = emb.embedding.layouts()
  assert held == plan.layouts()
  assert held["users"].row_sharded and not held["items"].row_sharded
  assert held["items"].dtype == "bfloat16" and held["users"].dtype == "float32"


@pytest.mark.parametrize("key", sorted(planning.MOVED_OPTIONS))
def test_a_layout_in_the_layers_backend_options_is_refused(key):
  with pytest.raises(
    planning.PlacementSettingsError,
    match=rf"backend_options\['{key}'\] -> "
    rf"{planning.MOVED_OPTIONS[key]}.*the layer's placement=",
  ):
    layers.Embedding(
      _config(), "sgd", backend="tensorcore", backend_options={key: 1}
    )
