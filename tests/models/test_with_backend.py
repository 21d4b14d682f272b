"""Models trained through the tensorcore embedding backend, with 1 and 2 replicas.

The step is the TPU pattern the trainer uses: lookup under a tape, the model's
per-replica loss, the dense optimizer on the model's variables and
`backend.apply_gradients` on the activation gradients.
"""

import numpy as np
import pytest
import tensorflow as tf

import backends
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys.feature_spec import FeatureSpec
from recsys.models import DLRM, LossInputs, TwoTower
from recsys.models.base import replica_loss
from tests.conftest import mirrored_strategy

embedding = tf.tpu.experimental.embedding
GLOBAL_BATCH = 10


def _feature_config():
  users = embedding.TableConfig(23, 7, name="users", combiner="mean")
  items = embedding.TableConfig(29, 7, name="items")
  tags = embedding.TableConfig(11, 7, name="tags", combiner="sum")
  return {
    "user": embedding.FeatureConfig(users, name="user"),
    "item": embedding.FeatureConfig(items, name="item"),
    "tags": embedding.FeatureConfig(tags, name="tags"),
  }


SPECS = [
  FeatureSpec("user", 23),
  FeatureSpec("item", 29),
  FeatureSpec("tags", 11, multi_hot=True, max_ids=3, weighted=True),
]


def _data(seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 4, GLOBAL_BATCH)
  tags = rng.integers(0, 11, lengths.sum())
  return {
    "dense": rng.normal(size=(GLOBAL_BATCH, 3)).astype(np.float32),
    "user": rng.integers(0, 23, GLOBAL_BATCH),
    "item": rng.permutation(29)[:GLOBAL_BATCH],
    "tag_values": tags,
    "tag_lengths": lengths,
    "tag_weights": rng.uniform(0.5, 2.0, lengths.sum()).astype(np.float32),
    "labels": rng.integers(0, 2, GLOBAL_BATCH).astype(np.float32),
  }


def _dataset(data, strategy, backend):
  def fn(ctx):
    per_replica = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
    tags = tf.RaggedTensor.from_row_lengths(
      data["tag_values"], data["tag_lengths"]
    )
    weights = tf.RaggedTensor.from_row_lengths(
      data["tag_weights"], data["tag_lengths"]
    )
    features = {
      "dense": data["dense"],
      "categorical": {"user": data["user"], "item": data["item"], "tags": tags},
      "weights": {"tags": weights},
    }
    ds = tf.data.Dataset.from_tensor_slices((features, data["labels"]))
    return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(
      per_replica
    )

  return strategy.distribute_datasets_from_function(
    fn, options=backend.input_options()
  )


def _train_one_step(strategy, model_fn, data):
  tf.keras.utils.set_random_seed(1)
  with strategy.scope():
    backend = backends.create(
      _feature_config(), embedding.SGD(0.5), strategy, backend="tensorcore"
    )
    backend.build()
    model = model_fn()
    model.create_variables({"user": 7, "item": 7, "tags": 7})
    optimizer = tf.keras.optimizers.SGD(0.5)
    optimizer.build(model.trainable_variables)

  @tf.function
  def step(batch):
    def replica_fn(features, labels):
      weights = {
        "user": None,
        "item": None,
        "tags": features["weights"]["tags"],
      }
      with tf.GradientTape() as tape:
        acts = backend.lookup(features["categorical"], weights, training=True)
        tape.watch(acts)
        loss = replica_loss(
          model,
          model.per_example_loss(LossInputs(acts, features, labels)),
          GLOBAL_BATCH,
        )
      variables = model.trainable_variables
      grads, act_grads = tape.gradient(loss, (variables, acts))
      optimizer.apply_gradients(zip(grads, variables))
      backend.apply_gradients(act_grads)
      return loss

    return strategy.reduce(
      "SUM", strategy.run(replica_fn, args=batch), axis=None
    )

  initial = {t.name: v.numpy() for t, v in backend.embedding_tables.items()}
  loss = step(next(iter(_dataset(data, strategy, backend))))
  tables = {t.name: v.numpy() for t, v in backend.embedding_tables.items()}
  for name, table in tables.items():
    assert not np.allclose(table, initial[name]), (
      f"table {name} was not updated"
    )
  return loss.numpy(), tables, [w.numpy() for w in model.trainable_variables]


@pytest.mark.slow
def test_dlrm_two_replicas_match_one_replica():
  """One DLRM step on 2 replicas == one step on 1 replica with the same global batch."""
  data = _data()
  model_fn = lambda: DLRM(SPECS, num_dense=3, bottom_mlp=(7,), top_mlp=(9,))
  one = _train_one_step(tf.distribute.get_strategy(), model_fn, data)
  two = _train_one_step(mirrored_strategy(2), model_fn, data)
  np.testing.assert_allclose(two[0], one[0], rtol=1e-5)
  for name in one[1]:
    np.testing.assert_allclose(two[1][name], one[1][name], rtol=1e-5, atol=1e-6)
  for a, b in zip(two[2], one[2]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_tower_trains_through_backend_on_two_replicas():
  """Every table (query, candidate, weighted multi-hot side feature) gets updated.

  Only that the hand-written step runs and trains is checked here; that 2
  replicas train the 1-replica model (negatives from the global batch) is
  tests/models/test_two_tower_replicas.py's.
  """
  model_fn = lambda: TwoTower(
    SPECS, ["user", "tags"], ["item"], query_tower=(5,), candidate_tower=(5,)
  )
  loss, _, _ = _train_one_step(mirrored_strategy(2), model_fn, _data())
  assert np.isfinite(loss)
