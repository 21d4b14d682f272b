"""recsys.layers.Embedding in Keras `fit`: against a hand loop, NumPy, TFRS, checkpoints.

References, not self-consistency: `fit` on N mirrored replicas against the
backend's own `lookup`/`apply_gradients` loop on one replica with the whole
batch; one step against the NumPy TPU optimizer math; the forward pass
against TFRS's `TPUEmbedding` layer; checkpoints read by TF's
`TPUEmbeddingForServing`.
"""

import numpy as np
import pytest

import backends
from backends import reference_optimizers as ref
from recsys import layers
from recsys._keras import keras, tf
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
USERS, MOVIES = 23, 29
BATCH, STEPS = 8, 4


def feature_config(optimizer=None):
  users = E.TableConfig(USERS, 7, name="users")
  movies = E.TableConfig(
    MOVIES, 11, name="movies", combiner="mean", optimizer=optimizer
  )
  return {
    "user": E.FeatureConfig(users, name="user"),
    "movie": E.FeatureConfig(movies, name="movie"),
  }


def data(seed=0, n=BATCH * STEPS):
  rng = np.random.default_rng(seed)
  x = {"user": rng.integers(0, USERS, n), "movie": rng.integers(0, MOVIES, n)}
  y = rng.normal(size=(n, 1)).astype("float32")
  return x, y


def initial_values(config):
  rng = np.random.default_rng(7)
  tables = {
    f.table.name: rng.normal(
      size=(f.table.vocabulary_size, f.table.dim)
    ).astype("float32")
    for f in config.values()
  }
  kernel = rng.normal(size=(18, 1)).astype("float32")
  return tables, [kernel, np.zeros([1], "float32")]


def ranking_model(emb, dense_trainable=True):
  """The TFRS ranking tutorial's shape: ids -> embeddings -> a dense score."""
  inputs = {
    k: keras.Input([], dtype=tf.int64, name=k) for k in ("user", "movie")
  }
  acts = emb(inputs)
  dense = keras.layers.Dense(1, trainable=dense_trainable)
  return keras.Model(
    inputs, dense(tf.concat([acts["user"], acts["movie"]], -1))
  )


def set_values(tables_by_config, dense, tables, dense_values):
  for config, var in tables_by_config.items():
    var.assign(tables[config.name])
  dense.set_weights(dense_values)


def hand_loop(config, tables, dense_values, x, y, dense_lr):
  """The backend's documented loop on one replica, whole batches."""
  emb = backends.create(config, E.Adagrad(0.1), backend="tensorcore")
  emb.build()
  dense = keras.layers.Dense(1)
  dense.build([None, 18])
  set_values(emb.embedding_tables, dense, tables, dense_values)
  opt = keras.optimizers.SGD(dense_lr)
  for step in range(STEPS):
    rows = slice(step * BATCH, (step + 1) * BATCH)
    ids = {k: tf.constant(v[rows]) for k, v in x.items()}
    with tf.GradientTape() as tape:
      acts = emb.lookup(ids, training=True)
      pred = dense(tf.concat([acts["user"], acts["movie"]], -1))
      loss = tf.reduce_mean(tf.square(pred - y[rows]))
    dense_grads, act_grads = tape.gradient(
      loss, (dense.trainable_variables, acts)
    )
    opt.apply_gradients(zip(dense_grads, dense.trainable_variables))
    emb.apply_gradients(act_grads)
  return emb, dense


@pytest.mark.parametrize("replicas", [1, 2])
def test_fit_equals_the_backend_loop_on_one_replica(replicas):
  strategy = (
    tf.distribute.get_strategy()
    if replicas == 1
    else mirrored_strategy(replicas)
  )
  config = feature_config()
  tables, dense_values = initial_values(config)
  x, y = data()
  with strategy.scope():
    emb = layers.Embedding(config, E.Adagrad(0.1))
    model = ranking_model(emb)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  set_values(emb.embedding_tables, model.layers[-1], tables, dense_values)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
  model.fit(ds, epochs=1, verbose=0, shuffle=False)

  ref_emb, ref_dense = hand_loop(config, tables, dense_values, x, y, 0.05)
  for config_, var in emb.embedding_tables.items():
    ref_var = ref_emb.embedding_tables[
      [t for t in ref_emb.embedding_tables if t.name == config_.name][0]
    ]
    np.testing.assert_allclose(
      var.numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-6
    )
    assert not np.allclose(var.numpy(), tables[config_.name])  # it trained
  for name, slots in emb.embedding.slot_variables().items():
    for slot, var in slots.items():
      np.testing.assert_allclose(
        var.numpy(),
        ref_emb.slot_variables()[name][slot].numpy(),
        rtol=1e-5,
        atol=1e-6,
      )
  for got, want in zip(model.layers[-1].get_weights(), ref_dense.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The trap's anchor got zero gradients: it stays 0 and is not trained.
  trap = [v for v in model.trainable_variables if "gradient_trap" in v.name]
  assert len(trap) == 1 and float(tf.reduce_sum(tf.abs(trap[0]))) == 0.0
  assert not any(
    v is t
    for v in model.trainable_variables
    for t in emb.embedding_tables.values()
  )


def test_one_fit_step_follows_the_numpy_tpu_math():
  """Adagrad (users) and FTRL (movies) rows after one step, from NumPy."""
  ftrl = E.FTRL(0.2, l1_regularization_strength=0.01)
  config = feature_config(optimizer=ftrl)
  tables, dense_values = initial_values(config)
  x, y = data(n=BATCH)
  emb = layers.Embedding(config, E.Adagrad(0.1))
  model = ranking_model(emb, dense_trainable=False)
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  set_values(emb.embedding_tables, model.layers[-1], tables, dense_values)
  model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)

  kernel = dense_values[0].astype(np.float64)
  pred = (
    np.concatenate(
      [tables["users"][x["user"]], tables["movies"][x["movie"]]], -1
    )
    @ kernel
  )
  d_pred = 2.0 * (pred - y) / BATCH  # d mean-squared / d pred
  d_acts = d_pred @ kernel.T  # [B, 18]
  for feature, table, opt, cols in (
    ("user", "users", E.Adagrad(0.1), slice(0, 7)),
    ("movie", "movies", ftrl, slice(7, 18)),
  ):
    want, want_slots = ref.first_step(
      opt, tables[table], x[feature], d_acts[:, cols]
    )
    var = [v for c, v in emb.embedding_tables.items() if c.name == table][0]
    np.testing.assert_allclose(var.numpy(), want, rtol=1e-5, atol=1e-6)
    for slot, value in emb.embedding.slot_variables()[table].items():
      np.testing.assert_allclose(
        value.numpy(), want_slots[slot], rtol=1e-5, atol=1e-6
      )


def test_forward_matches_tfrs_tpu_embedding_layer():
  """Same config, tables and ids: TFRS's layer (CPU path) and ours agree."""
  import tensorflow_recommenders as tfrs  # pylint: disable=g-import-not-at-top

  config = feature_config()
  tables, _ = initial_values(config)
  theirs = tfrs.layers.embedding.TPUEmbedding(config, E.Adagrad(0.1))
  ours = layers.Embedding(config, E.Adagrad(0.1))
  ragged = tf.ragged.constant([[1, 4, 4], [], [28], [0, 2]], tf.int64)
  ids = {"user": tf.constant([3, 0, 22, 5], tf.int64), "movie": ragged}
  theirs(ids)
  ours(ids)
  for layer in (theirs, ours):
    for c, var in layer.embedding_tables.items():
      var.assign(tables[c.name])
  want, got = theirs(ids), ours(ids)
  for k in want:
    np.testing.assert_allclose(
      got[k].numpy(), want[k].numpy(), rtol=1e-6, atol=1e-7
    )


def _trained_layer():
  config = feature_config()
  emb = layers.Embedding(config, E.Adagrad(0.1))
  model = ranking_model(emb)
  model.compile(optimizer="sgd", loss="mse")
  x, y = data()
  model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
  return emb, model


def _by_name(tables):
  return {c.name: v.numpy() for c, v in tables.items()}


def test_checkpoints_move_between_layer_backend_and_tf_serving(tmp_path):
  emb, model = _trained_layer()
  path = tf.train.Checkpoint(embedding=emb.embedding).save(
    str(tmp_path / "layer")
  )
  names = {k for k, _ in tf.train.list_variables(path)}
  assert "embedding/users/.ATTRIBUTES/VARIABLE_VALUE" in names
  assert "embedding/users.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE" in names

  # -> TF's own serving class.
  serving = E.TPUEmbeddingForServing(feature_config(), E.Adagrad(0.1))
  serving.build()
  tf.train.Checkpoint(embedding=serving).restore(
    path
  ).assert_existing_objects_matched()
  for name, value in _by_name(emb.embedding_tables).items():
    np.testing.assert_array_equal(
      _by_name(serving.embedding_tables)[name], value
    )

  # -> the backend the Trainer builds (and its slots), verified by name.
  trainer_backend = backends.create(feature_config(), E.Adagrad(0.1))
  trainer_backend.build()
  backends.checkpoint.restore(trainer_backend, path)
  for name, value in _by_name(emb.embedding_tables).items():
    np.testing.assert_array_equal(
      _by_name(trainer_backend.embedding_tables)[name], value
    )
  np.testing.assert_array_equal(
    trainer_backend.slot_variables()["movies"]["accumulators"].numpy(),
    emb.embedding.slot_variables()["movies"]["accumulators"].numpy(),
  )

  # Backend checkpoint -> a fresh layer; and model.save_weights round trip.
  back = tf.train.Checkpoint(embedding=trainer_backend).save(
    str(tmp_path / "backend")
  )
  fresh = layers.Embedding(feature_config(), E.Adagrad(0.1))
  fresh.build(None)
  tf.train.Checkpoint(embedding=fresh.embedding).restore(back).assert_consumed()
  np.testing.assert_array_equal(
    _by_name(fresh.embedding_tables)["users"],
    _by_name(emb.embedding_tables)["users"],
  )
  model.save_weights(str(tmp_path / "weights"))
  other = layers.Embedding(feature_config(), E.Adagrad(0.1))
  other_model = ranking_model(other)
  other_model.load_weights(
    str(tmp_path / "weights")
  ).assert_existing_objects_matched()
  np.testing.assert_array_equal(
    _by_name(other.embedding_tables)["movies"],
    _by_name(emb.embedding_tables)["movies"],
  )
  np.testing.assert_array_equal(
    other.embedding.slot_variables()["users"]["accumulators"].numpy(),
    emb.embedding.slot_variables()["users"]["accumulators"].numpy(),
  )


def test_evaluate_and_predict_do_not_train():
  emb, model = _trained_layer()
  before = _by_name(emb.embedding_tables)
  x, y = data(seed=1)
  model.evaluate(x, y, batch_size=BATCH, verbose=0)
  pred = model.predict(x, batch_size=BATCH, verbose=0)
  assert pred.shape == (BATCH * STEPS, 1)
  for name, value in _by_name(emb.embedding_tables).items():
    np.testing.assert_array_equal(value, before[name])


def test_a_frozen_layer_keeps_its_tables_while_fit_trains_the_rest():
  config = feature_config()
  emb = layers.Embedding(config, E.Adagrad(0.1))
  model = ranking_model(emb)
  emb.trainable = False
  model.compile(optimizer="sgd", loss="mse")
  x, y = data()
  model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # builds
  before = _by_name(emb.embedding_tables)
  kernel = model.layers[-1].get_weights()[0]
  model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # no pending error
  for name, value in _by_name(emb.embedding_tables).items():
    np.testing.assert_array_equal(value, before[name])
  assert not np.allclose(model.layers[-1].get_weights()[0], kernel)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_layer_called_twice_in_one_step_says_so_and_what_to_do(replicas):
  """Two lookups of one layer in a training step (a query and a candidate
  tower sharing it): the error said "use recsys.layers.Embedding", which
  the model already did."""
  strategy = (
    tf.distribute.get_strategy()
    if replicas == 1
    else mirrored_strategy(replicas)
  )
  with strategy.scope():
    emb = layers.Embedding(feature_config(), E.Adagrad(0.1))
    inputs = {
      k: keras.Input([], dtype=tf.int64, name=k)
      for k in ("user", "movie", "other_user", "other_movie")
    }
    first = emb({"user": inputs["user"], "movie": inputs["movie"]})
    second = emb({"user": inputs["other_user"], "movie": inputs["other_movie"]})
    out = keras.layers.Dense(1)(
      tf.concat(list(first.values()) + list(second.values()), -1)
    )
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse")
  x, y = data()
  x.update(other_user=x["user"][::-1], other_movie=x["movie"][::-1])
  with pytest.raises(layers.EmbeddingCalledTwiceError) as info:
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
  message = str(info.value)
  assert f"layer {emb.name!r} was called twice for training in one step" in (
    message
  )
  assert "in one call" in message and "its own layer" in message
  assert "use recsys.layers.Embedding" not in message
  assert isinstance(info.value, backends.UnappliedGradientsError)
