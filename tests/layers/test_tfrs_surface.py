"""TFRS's call surface on `recsys.layers.Embedding`, and its red-team cases.

What TFRS's `TPUEmbedding` layer accepts must work here unchanged: building
at the first call inside a replica step, float ids, sparse/ragged
`keras.Input`s, `serving_config`, a custom loop that applies a Keras
optimizer to `model.trainable_variables`. References: the backend's own
`lookup`/`apply_gradients` loop on one replica, TF's
`serving_embedding_lookup`, and integer ids.
"""

import logging
import os

import numpy as np
import pytest
import tensorflow_recommenders as tfrs

import backends
from backends.base import GradientDtypeError
from backends.inputs import InvalidInputError
from recsys import layers
from recsys._keras import keras, tf
from recsys.layers.embedding import RELOADED_MODEL_CANNOT_TRAIN
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
USERS, MOVIES, BATCH = 11, 13, 4


def strategy_for(replicas):
  if replicas == 0:
    return tf.distribute.get_strategy()
  return mirrored_strategy(replicas)


def config():
  users = E.TableConfig(
    USERS, 3, name="users", initializer=tf.constant_initializer(0.5)
  )
  movies = E.TableConfig(MOVIES, 2, name="movies", combiner="sum")
  return {
    "user": E.FeatureConfig(users, name="user"),
    "movie": E.FeatureConfig(movies, name="movie"),
  }


def tables_of(emb):
  return {t.name: v.numpy().copy() for t, v in emb.embedding_tables.items()}


def ratings(n=16, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "user": rng.integers(0, USERS, n).astype("float32"),  # float, as TFRS's
    "movie": rng.integers(0, MOVIES, n).astype("float32"),  # to_number gives
    "rating": rng.uniform(1, 5, n).astype("float32"),
  }


class RatingModel(tfrs.models.Model):
  """The TPU-embedding tutorial's shape: the layer first called in fit."""

  def __init__(self, optimizer):
    super().__init__()
    self.embedding_layer = layers.Embedding(config(), optimizer=optimizer)
    self.score = keras.layers.Dense(1)
    self.task = tfrs.tasks.Ranking(
      loss=keras.losses.MeanSquaredError(reduction=keras.losses.Reduction.SUM)
    )

  def compute_loss(self, features, training=False):
    acts = self.embedding_layer(
      {"user": features["user"], "movie": features["movie"]}
    )
    pred = self.score(tf.concat([acts["user"], acts["movie"]], 1))
    return self.task(labels=features["rating"], predictions=pred)

  def call(self, features, serving_config=None):
    acts = self.embedding_layer(
      {"user": features["user"], "movie": features["movie"]},
      serving_config=serving_config,
    )
    return self.score(tf.concat([acts["user"], acts["movie"]], 1))


@pytest.mark.parametrize(
  "replicas", [0, 1, 2], ids=["default", "mirrored1", "mirrored2"]
)
def test_built_at_its_first_call_inside_fit_on_any_strategy(replicas):
  strategy = strategy_for(replicas)
  with strategy.scope():
    optimizer = keras.optimizers.Adagrad(0.5)
    model = RatingModel(optimizer)
    model.compile(optimizer=optimizer)
  data = tf.data.Dataset.from_tensor_slices(ratings()).batch(BATCH)
  model.fit(data, epochs=1, verbose=0)  # builds in the replica step
  first = tables_of(model.embedding_layer)
  model.fit(data, epochs=1, verbose=0)
  for name, value in tables_of(model.embedding_layer).items():
    assert not np.allclose(value, first[name]), name
  results = model.evaluate(data, verbose=0, return_dict=True)
  assert np.isfinite(results["loss"])
  assert tables_of(model.embedding_layer).keys() == {"users", "movies"}


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_backend_used_directly_builds_inside_a_replica_step(replicas):
  strategy = mirrored_strategy(replicas)
  with strategy.scope():
    explicit = backends.create(config(), E.SGD(0.1), backend="tensorcore")
    lazy = backends.create(config(), E.SGD(0.1), backend="tensorcore")

  @tf.function
  def step():
    def replica_fn():
      explicit.build()  # TPUEmbedding-style, but inside strategy.run
      ids = {"user": tf.constant([1, 2]), "movie": tf.constant([3, 4])}
      return lazy.lookup(ids)["user"]  # builds on first use

    return strategy.run(replica_fn)

  step()
  for emb in (explicit, lazy):
    assert {t.name for t in emb.embedding_tables} == {"users", "movies"}


def test_float_ids_that_hold_whole_numbers_are_ids_and_others_are_refused():
  emb = layers.Embedding(config(), "sgd")
  ints = {"user": tf.constant([3, 0, 10]), "movie": tf.constant([1, 2, 12])}
  floats = {k: tf.cast(v, tf.float32) for k, v in ints.items()}
  want = emb(ints)
  for got in (emb(floats), tf.function(emb)(floats)):
    for k in want:
      np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())
  for bad, match in (
    (2.5, r"feature 'movie' \(table 'movies'\) got the float id 2.5"),
    (2.0**24, "whole numbers below 16,777,216"),
  ):
    ids = dict(floats, movie=tf.constant([1.0, bad, 3.0]))
    with pytest.raises(InvalidInputError, match=match):
      emb(ids)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`movie`"):
      tf.function(emb)(ids)
  ragged = tf.ragged.constant([[1.0, 2.0], [], [0.5]])
  with pytest.raises(InvalidInputError, match="float id 0.5"):
    emb({"user": ragged, "movie": floats["movie"]})


def test_a_fractional_id_in_a_compiled_step_is_refused_after_the_step():
  emb = layers.Embedding(config(), "sgd")
  ids = {"user": tf.constant([1.0, 2.0]), "movie": tf.constant([1.0, 7.5])}
  tf.function(emb, jit_compile=True)(ids)
  with pytest.raises(InvalidInputError, match="feature 'movie'.*got id -1"):
    emb.embedding.raise_for_invalid_inputs()


def test_serving_config_looks_up_other_features_on_the_same_tables():
  cfg = config()
  emb = layers.Embedding(cfg, "adagrad")
  emb({"user": tf.constant([0]), "movie": tf.constant([0])})
  users, movies = cfg["user"].table, cfg["movie"].table
  # By object and, for a copy of a table's config, by name.
  movies_copy = E.TableConfig(MOVIES, 2, name="movies", combiner="sum")
  serving = {
    "history": E.FeatureConfig(movies_copy, name="history"),
    "user": E.FeatureConfig(users, name="user"),
  }
  ids = {
    "history": tf.ragged.constant([[1, 2, 2], [12]]),
    "user": tf.constant([4.0, 9.0]),
  }
  got = emb(ids, serving_config=serving)
  int_ids = dict(ids, user=tf.constant([4, 9]))
  want = E.serving_embedding_lookup(
    int_ids,
    None,
    {
      movies_copy: emb.embedding_tables[movies],
      users: emb.embedding_tables[users],
    },
    serving,
  )
  for k in want:
    np.testing.assert_allclose(got[k].numpy(), want[k].numpy())
  unknown = {"x": E.FeatureConfig(E.TableConfig(5, 2, name="other"))}
  with pytest.raises(ValueError, match="table 'other'.*'movies', 'users'"):
    emb({"x": tf.constant([1])}, serving_config=unknown)


def functional_model(emb, kind):
  """TFRS's layer-test model: `keras.Input(batch_size=..., sparse/ragged)`."""
  inputs = {
    k: keras.Input(
      batch_size=BATCH, shape=(), dtype=tf.int32, name=k, **{kind: True}
    )
    for k in ("user", "movie")
  }
  acts = emb(inputs)
  return keras.Model(inputs, acts)


def bags(kind):
  rows = {"user": [[1], [2, 5], [], [10]], "movie": [[3, 3], [0], [12], [7]]}
  ragged = {k: tf.ragged.constant(v, tf.int32) for k, v in rows.items()}
  if kind == "ragged":
    return ragged
  return {k: v.to_sparse() for k, v in ragged.items()}


def loop_reference(initial, kind, steps):
  """The backend's own loop on one replica: lookup, tape, apply."""
  emb = backends.create(config(), E.Adagrad(0.1, 10.0), backend="tensorcore")
  emb.build()
  for t, var in emb.embedding_tables.items():
    var.assign(initial[t.name])
  for _ in range(steps):
    with tf.GradientTape() as tape:
      acts = emb.lookup(bags(kind), training=True)
      loss = sum(tf.reduce_mean(tf.reduce_sum(a * a, 1)) for a in acts.values())
    emb.apply_gradients(tape.gradient(loss, acts))
  return tables_of(emb)


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
@pytest.mark.parametrize("replicas", [0, 2], ids=["default", "mirrored2"])
def test_tfrs_custom_loop_with_a_keras_optimizer_trains_the_tables(
  kind, replicas
):
  """TFRS's layer test, checked: the loop applies a legacy Keras Adagrad to
  `model.trainable_variables`; the tables follow the embedding Adagrad."""
  strategy = strategy_for(replicas)
  with strategy.scope():
    optimizer = keras.optimizers.legacy.Adagrad(
      0.1, initial_accumulator_value=10
    )
    emb = layers.Embedding(config(), optimizer=optimizer)
    model = functional_model(emb, kind)
  initial = tables_of(emb)
  data = tf.data.Dataset.from_tensors(bags(kind)).repeat(2)
  dist = iter(
    strategy.experimental_distribute_dataset(
      data, tf.distribute.InputOptions(experimental_fetch_to_device=False)
    )
  )

  @tf.function
  def train(features):
    def step(features):
      with tf.GradientTape() as tape:
        acts = model(features)
        loss = sum(
          tf.reduce_mean(tf.reduce_sum(a * a, 1)) for a in acts.values()
        )
        loss /= strategy.num_replicas_in_sync
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))

    strategy.run(step, args=(features,))

  for _ in range(2):
    train(next(dist))
  if replicas == 2:
    # Each replica's mean over its half: the global loss is their mean.
    assert all(
      not np.allclose(v, initial[k]) for k, v in tables_of(emb).items()
    )
    return
  want = loop_reference(initial, kind, steps=2)
  for name, value in tables_of(emb).items():
    np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-6)


def dense_model():
  emb = layers.Embedding(config(), E.SGD(0.5))
  inputs = {
    k: keras.Input([], dtype=tf.int64, name=k) for k in ("user", "movie")
  }
  acts = emb(inputs)
  dense = keras.layers.Dense(1)
  model = keras.Model(
    inputs, dense(tf.concat([acts["user"], acts["movie"]], 1))
  )
  return model, emb, dense


IDS = {"user": tf.constant([1, 2, 3]), "movie": tf.constant([4, 5, 6])}


def test_tables_move_only_when_the_gradient_request_covers_them():
  model, emb, dense = dense_model()
  before = tables_of(emb)

  def unchanged():
    return all(np.array_equal(v, before[k]) for k, v in tables_of(emb).items())

  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(IDS))
  tape.gradient(loss, dense.kernel)
  assert unchanged()

  @tf.function
  def dense_only(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(ids))
    return tape.gradient(loss, dense.kernel)

  dense_only(IDS)
  dense_only(IDS)
  assert unchanged()
  # A persistent tape asked for the dense kernel, then for everything.
  with tf.GradientTape(persistent=True) as tape:
    loss = tf.reduce_sum(model(IDS))
  tape.gradient(loss, dense.kernel)
  assert unchanged()
  tape.gradient(loss, model.trainable_variables)
  assert not unchanged()


def test_training_true_outside_any_tape_says_so_and_leaves_nothing_pending(
  caplog,
):
  model, emb, _ = dense_model()
  before = tables_of(emb)
  with caplog.at_level(logging.WARNING, logger="recsys.layers"):
    emb(IDS, training=True)
    emb(IDS, training=True)
  said = [
    r for r in caplog.records if "outside any tf.GradientTape" in r.message
  ]
  assert len(said) == 1
  assert all(np.array_equal(v, before[k]) for k, v in tables_of(emb).items())
  with tf.GradientTape() as tape:  # no lookup left waiting: this one trains
    loss = tf.reduce_sum(model(IDS))
  tape.gradient(loss, model.trainable_variables)
  assert not all(
    np.array_equal(v, before[k]) for k, v in tables_of(emb).items()
  )


def test_features_of_different_batch_sizes_are_refused_by_name():
  _, emb, _ = dense_model()
  ids = {"user": tf.constant([1, 2, 3]), "movie": tf.constant([4])}
  with pytest.raises(InvalidInputError, match="same batch size") as error:
    emb(ids)
  assert "'user' (table 'users'): 3" in str(error.value)
  assert "'movie' (table 'movies'): 1" in str(error.value)
  spec = {k: tf.TensorSpec([None], tf.int32) for k in ids}
  step = tf.function(lambda x: emb.embedding.lookup(x), input_signature=[spec])
  with pytest.raises(tf.errors.InvalidArgumentError, match="batch size"):
    step(ids)


def test_activation_gradients_of_an_integer_dtype_are_refused_by_name():
  emb = backends.create(config(), E.SGD(0.1), backend="tensorcore")
  emb.lookup(IDS, training=True)
  grads = {"user": tf.zeros([3, 3], tf.int32), "movie": tf.zeros([3, 2])}
  with pytest.raises(
    GradientDtypeError, match=r"feature 'user' \(table 'users'\).*int32"
  ):
    emb.apply_gradients(grads)


def test_a_model_loaded_from_a_saved_model_refuses_to_train_and_says_how(
  tmp_path,
):
  model, emb, _ = dense_model()
  model.compile("sgd", "mse")
  x, y = {k: v.numpy() for k, v in IDS.items()}, np.ones([3, 1], "float32")
  model.fit(x, y, verbose=0)
  path = str(tmp_path / "saved")
  model.save(path)
  loaded = keras.models.load_model(path)
  np.testing.assert_allclose(
    loaded.predict(x, verbose=0), model.predict(x, verbose=0)
  )
  loaded.compile("sgd", "mse")
  with pytest.raises(Exception, match="cannot train.*load_weights"):
    loaded.fit(x, y, verbose=0)
  # What the message says: a model built in Python, weights restored, trains.
  again, emb_again, _ = dense_model()
  again.compile("sgd", "mse")
  again.load_weights(os.path.join(path, "variables", "variables"))
  restored = tables_of(emb_again)
  for name, value in tables_of(emb).items():
    np.testing.assert_array_equal(restored[name], value)
  again.fit(x, y, verbose=0)
  assert not all(
    np.array_equal(v, restored[k]) for k, v in tables_of(emb_again).items()
  )
  assert "load_weights" in RELOADED_MODEL_CANNOT_TRAIN
