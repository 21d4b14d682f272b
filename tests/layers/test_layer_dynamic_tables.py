"""The Keras layer with a dynamic-vocabulary table, trained by `fit`.

A table declared dynamic in the layer's `placement=` takes raw ids (any
int64) in `call`: a training call maps them (admitting, evicting, resetting
reused rows) once for every replica's ids, inference reads the index. `fit`
on 2 replicas must train the one-replica model, and the layer's training
must be the backend's own loop (map, lookup, apply) on the same batches.
"""

import numpy as np
import tensorflow as tf

from backends.vocabulary import DynamicVocabulary
from recsys import layers, planning
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
CAPACITY, DIM, BATCH, STEPS = 6, 4, 8, 5


def _data():
  """Raw ids from a window that moves on: the table fills and evicts."""
  rng = np.random.default_rng(2)
  ids = (
    np.concatenate(
      [rng.integers(2 * s, 2 * s + 10, size=BATCH) for s in range(STEPS)]
    ).astype(np.int64)
    * 7_919
    + 2**50
  )
  labels = rng.random(len(ids)).astype(np.float32)
  return ids, labels


def _model():
  table = E.TableConfig(CAPACITY, DIM, name="items")
  placement = planning.EmbeddingPlacement(
    vocabularies={"items": DynamicVocabulary(eviction="lru")}
  )
  inputs = tf.keras.Input(shape=(), dtype=tf.int64, name="item")
  emb = layers.Embedding(
    {"item": E.FeatureConfig(table)},
    E.SGD(0.5),
    backend="tensorcore",
    placement=placement,
  )
  acts = emb({"item": inputs})["item"]
  out = tf.keras.layers.Dense(
    1, kernel_initializer="ones", bias_initializer="zeros"
  )(acts)
  model = tf.keras.Model(inputs, out)
  model.compile(tf.keras.optimizers.SGD(0.0), loss="mse")
  return model, emb


def _fit(replicas: int):
  strategy = mirrored_strategy(replicas)
  with strategy.scope():
    model, emb = _model()
  ids, labels = _data()
  model.fit(ids, labels, batch_size=BATCH, shuffle=False, verbose=0)
  index = emb.embedding.dynamic_tables()["items"]
  keys, rows = (t.numpy() for t in index.mapping())
  table = tf.convert_to_tensor(
    next(iter(emb.embedding.embedding_tables.values()))
  ).numpy()
  counters = {k: int(v) for k, v in index.counters().items()}
  return table, keys, rows, counters, model, emb


def test_fit_on_two_replicas_trains_the_one_replica_tables():
  one = _fit(1)
  two = _fit(2)
  np.testing.assert_allclose(two[0], one[0], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(two[1], one[1])
  np.testing.assert_array_equal(two[2], one[2])
  assert two[3] == one[3]
  assert one[3]["evictions"] > 0, one[3]


def test_fit_trains_as_the_backends_own_loop():
  """The same batches through map_ids, lookup and apply_gradients by hand
  (the loss's gradient: 2 * (act . 1 - label) / B per dimension)."""
  table, keys, rows, counters, _, _ = _fit(1)
  model, emb = _model()
  backend = emb.embedding
  ids, labels = _data()
  for step in range(STEPS):
    batch = tf.constant(ids[step * BATCH : (step + 1) * BATCH])
    label = labels[step * BATCH : (step + 1) * BATCH]
    mapped = backend.map_ids({"item": batch}, training=True)
    with tf.GradientTape() as tape:
      acts = backend.lookup(mapped, training=True)
      tape.watch(acts)
      pred = tf.reduce_sum(acts["item"], axis=1)
      loss = tf.reduce_mean((pred - label) ** 2)
    backend.apply_gradients(tape.gradient(loss, acts))
  index = backend.dynamic_tables()["items"]
  np.testing.assert_array_equal(index.mapping()[0].numpy(), keys)
  assert {k: int(v) for k, v in index.counters().items()} == counters
  got = tf.convert_to_tensor(
    next(iter(backend.embedding_tables.values()))
  ).numpy()
  np.testing.assert_allclose(got, table, rtol=1e-5, atol=1e-6)


def test_inference_reads_the_index_without_changing_it():
  *_, counters, model, emb = _fit(1)
  index = emb.embedding.dynamic_tables()["items"]
  keys, _ = index.mapping()
  model.predict(np.append(keys.numpy(), [12345]), verbose=0)
  assert {k: int(v) for k, v in index.counters().items()} == counters
