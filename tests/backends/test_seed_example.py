"""TF's documented `TPUEmbeddingV0` training loop, run literally on tensorcore.

The code below is the example of `tf.tpu.experimental.embedding.TPUEmbeddingV0`'s
docstring with its placeholders filled in (a feature config, a dataset, a
model, a loss) and its typos mended: the object is created under the
strategy's scope and never built explicitly (the first use inside the replica
function builds it), features are ragged bags of varying length, the steps run
in one `tf.function` over `tf.range`, and a Keras optimizer applies the tape's
table gradients, its `add_slot` making the embedding optimizer's slots.

Reference: one replica on the combined batch; replicas' copies bit-identical.
"""

import numpy as np
import pytest
import tensorflow as tf

import backends
from tests.conftest import mirrored_strategy

GLOBAL_BATCH = 8
STEPS = 4
W = np.random.default_rng(5).normal(size=(6, 1)).astype(np.float32)


def seed_example(strategy, jit_compile=False):
  """Runs the documented loop; returns the embedding object."""
  rng = np.random.default_rng(11)
  rows = [
    list(rng.integers(0, 37, rng.integers(1, 7)))
    for _ in range(GLOBAL_BATCH * STEPS)
  ]
  feature_config = {
    "f": tf.tpu.experimental.embedding.FeatureConfig(
      tf.tpu.experimental.embedding.TableConfig(
        37,
        6,
        name="t",
        combiner="mean",
        initializer=tf.keras.initializers.RandomUniform(seed=1),
      )
    )
  }
  model = lambda activations: activations["f"] @ W

  # --- the documented example ---
  optimizer = tf.keras.optimizers.legacy.Adagrad(learning_rate=0.1)

  def slot_variable_creation_fn(table, slot_names, slot_initializers):
    slots = {}
    for slot, initializer in zip(slot_names, slot_initializers):
      slots[slot] = optimizer.add_slot(table, slot, initializer)
    return slots

  embedding_optimizer = tf.tpu.experimental.embedding.Adagrad(
    learning_rate=0.1, slot_variable_creation_fn=slot_variable_creation_fn
  )

  with strategy.scope():
    embedding = backends.TensorCoreEmbedding(
      feature_config=feature_config, optimizer=embedding_optimizer
    )

  def dataset_fn(ctx):
    # Replicas take consecutive batches: step s covers the same examples
    # on N replicas as on one.
    ds = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(rows, tf.int64))
    ds = ds.batch(
      ctx.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True
    )
    return ds.map(lambda ids: {"f": ids})

  distributed_dataset = strategy.distribute_datasets_from_function(
    dataset_fn=dataset_fn,
    options=tf.distribute.InputOptions(experimental_fetch_to_device=False),
  )
  dataset_iterator = iter(distributed_dataset)

  def tpu_step(embedding_features):
    with tf.GradientTape() as tape:
      tape.watch(embedding.embedding_tables.values())
      activations = embedding(embedding_features)
      model_output = model(activations)
      loss = tf.reduce_sum(tf.square(model_output - 1.0))

    embedding_gradients = tape.gradient(
      loss, embedding.embedding_tables.values()
    )
    optimizer.apply_gradients(
      list(zip(embedding_gradients, embedding.embedding_tables.values()))
    )

  if jit_compile:  # what a TPUStrategy does to the replica function
    tpu_step = tf.function(tpu_step, jit_compile=True)

  @tf.function
  def training_step(dataset_iterator, num_steps):
    for _ in tf.range(num_steps):
      strategy.run(tpu_step, args=(next(dataset_iterator),))

  # --- end of the example ---

  training_step(dataset_iterator, tf.constant(STEPS))
  return embedding


def tables(embedding):
  (var,) = embedding.embedding_tables.values()
  return (
    [
      v.numpy()
      for v in tf.distribute.get_strategy().experimental_local_results(var)
    ]
    if not hasattr(var, "values")
    else [v.numpy() for v in var.values]
  )


@pytest.fixture(scope="module")
def one_replica():
  return tables(seed_example(tf.distribute.get_strategy()))[0]


@pytest.mark.parametrize("num_replicas", [2, 4])
def test_seed_example_on_mirrored_replicas(one_replica, num_replicas):
  copies = tables(seed_example(mirrored_strategy(num_replicas)))
  for copy in copies[1:]:
    # Every replica applies the same summed update: bit-identical.
    np.testing.assert_array_equal(copy, copies[0])
  np.testing.assert_allclose(copies[0], one_replica, rtol=1e-5, atol=1e-6)
  initial = tf.keras.initializers.RandomUniform(seed=1)([37, 6]).numpy()
  assert not np.allclose(copies[0], initial)  # it trained


def test_seed_example_compiled(one_replica):
  """The replica function compiled with XLA, as a TPUStrategy compiles it."""
  copies = tables(seed_example(tf.distribute.get_strategy(), jit_compile=True))
  np.testing.assert_allclose(copies[0], one_replica, rtol=1e-5, atol=1e-6)
