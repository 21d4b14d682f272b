"""Keras optimizers given to the layer: translated, logged, never stepped.

TFRS's layer takes a Keras optimizer (its tutorial shares one with
`compile()`); the tables still train with the embedding optimizer's TPU
math. References: the hyper-parameters read back from the Keras object's
config, the learning rate from the Keras object's own state at each step,
and a `fit` step against the NumPy TPU Adagrad (`reference_optimizers`).
"""

import logging

import numpy as np
import pytest

import backends
from backends import reference_optimizers as ref
from recsys import layers
from recsys._keras import keras, tf
from recsys.layers import keras_optimizers

E = tf.tpu.experimental.embedding
K, KL = keras.optimizers, keras.optimizers.legacy


@pytest.mark.parametrize("legacy", [False, True], ids=["keras2", "legacy"])
def test_each_keras_optimizer_becomes_its_embedding_counterpart(legacy):
  mod = KL if legacy else K
  cases = [
    (mod.SGD(0.3), E.SGD, {}),
    (
      mod.Adagrad(0.2, initial_accumulator_value=0.7),
      E.Adagrad,
      {"initial_accumulator_value": 0.7},
    ),
    (
      mod.Adam(0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-4),
      E.Adam,
      {"beta_1": 0.8, "beta_2": 0.95, "epsilon": 1e-4},
    ),
    (
      mod.Ftrl(
        0.05,
        learning_rate_power=-0.6,
        initial_accumulator_value=0.3,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
        beta=0.5,
      ),
      E.FTRL,
      {
        "learning_rate_power": -0.6,
        "initial_accumulator_value": 0.3,
        "l1_regularization_strength": 0.01,
        "l2_regularization_strength": 0.02,
        "beta": 0.5,
      },
    ),
  ]
  for keras_opt, want_cls, want in cases:
    t = keras_optimizers.translate(keras_opt)
    assert type(t.optimizer) is want_cls
    lr = keras_opt.get_config()["learning_rate"]
    assert float(t.optimizer.learning_rate()) == pytest.approx(lr)
    for key, value in want.items():
      assert getattr(t.optimizer, key) == pytest.approx(value), key
    assert t.translated and type(keras_opt).__name__ in t.source


def test_what_cannot_be_kept_is_listed_with_its_value_and_reason():
  adagrad = keras_optimizers.translate(K.Adagrad(0.1))
  assert adagrad.not_kept == ("epsilon=1e-07 (the TPU Adagrad has no epsilon)",)
  sgd = keras_optimizers.translate(
    KL.SGD(0.1, momentum=0.9, clipnorm=1.0), ignore_unsupported_settings=True
  )
  assert any(n.startswith("momentum=0.9") for n in sgd.not_kept)
  assert any(n.startswith("clipnorm=1.0") for n in sgd.not_kept)
  assert keras_optimizers.translate(K.SGD(0.1)).not_kept == ()
  adam = keras_optimizers.translate(
    K.Adam(amsgrad=True), ignore_unsupported_settings=True
  )
  assert any("bias correction" in n for n in adam.not_kept)
  assert any(n.startswith("amsgrad=True") for n in adam.not_kept)


# Settings the embedding optimizer cannot apply, and whether TFRS's own
# translation (legacy optimizers only) refuses them too.
UNSUPPORTED = [
  (lambda: K.SGD(0.1, momentum=0.9), "momentum=0.9", None),
  (lambda: KL.SGD(0.1, momentum=0.9), "momentum=0.9", True),
  (lambda: KL.SGD(0.1, momentum=0.5, nesterov=True), "nesterov=True", True),
  (lambda: K.Adam(0.1, amsgrad=True), "amsgrad=True", None),
  (lambda: KL.Adam(0.1, amsgrad=True), "amsgrad=True", True),
  (lambda: K.Adagrad(0.1, clipnorm=1.0), "clipnorm=1.0", None),
  (lambda: KL.Adagrad(0.1, clipnorm=1.0), "clipnorm=1.0", True),
  (lambda: K.SGD(0.1, global_clipnorm=2.0), "global_clipnorm=2.0", None),
  # TFRS lets global_clipnorm through, and the tables ignored it there too.
  (lambda: KL.SGD(0.1, global_clipnorm=2.0), "global_clipnorm=2.0", False),
  (lambda: KL.Adagrad(0.1, epsilon=1e-3), "epsilon=0.001", True),
  (
    lambda: KL.Ftrl(0.1, l2_shrinkage_regularization_strength=0.1),
    "l2_shrinkage_regularization_strength=0.1",
    True,
  ),
  (lambda: K.Adagrad(0.1, use_ema=True), "use_ema=True", None),
]


@pytest.mark.parametrize("make, setting, tfrs_refuses", UNSUPPORTED)
def test_a_setting_the_tables_cannot_take_is_refused_unless_ignored(
  make, setting, tfrs_refuses, caplog
):
  """TFRS's layer refuses these; they were dropped with a warning and the
  tables trained without them. Now refused by name, with the fix; the
  layer's `ignore_unsupported_optimizer_settings=True` lets them through."""
  from tensorflow_recommenders.layers.embedding import (  # pylint: disable=g-import-not-at-top
    tpu_embedding_layer as tfrs_layer,
  )

  if tfrs_refuses is not None:
    if tfrs_refuses:
      with pytest.raises(ValueError):
        tfrs_layer.translate_keras_optimizer(make())
    else:
      tfrs_layer.translate_keras_optimizer(make())
  with pytest.raises(keras_optimizers.OptimizerTranslationError) as info:
    layers.Embedding(_config(), make())
  message = str(info.value)
  assert message.startswith(f"optimizer: the Keras {type(make()).__name__}")
  assert setting in message
  assert "ignore_unsupported_optimizer_settings=True" in message
  assert "compile() can keep this one" in message
  # Per table too, the table named.
  with pytest.raises(
    keras_optimizers.OptimizerTranslationError,
    match=f"TableConfig 'users'.s optimizer: .*{setting}",
  ):
    layers.Embedding(_config(table_optimizer=make()), E.SGD(0.1))
  with caplog.at_level(logging.WARNING, logger="recsys.layers"):
    layers.Embedding(
      _config(), make(), ignore_unsupported_optimizer_settings=True
    )
  said = [r.getMessage() for r in caplog.records if setting in r.getMessage()]
  assert len(said) == 2  # once per table


def test_a_shared_sgd_with_momentum_is_refused_before_fit_as_tfrs_does():
  """The tutorials' habit, one optimizer for the layer and compile(), with
  momentum: the tables would have trained with plain SGD."""
  shared = K.SGD(0.1, momentum=0.9)
  with pytest.raises(ValueError, match="momentum=0.9"):
    layers.Embedding(_config(), shared)
  emb = layers.Embedding(
    _config(), shared, ignore_unsupported_optimizer_settings=True
  )
  translated = emb.embedding.optimizer_for(emb.embedding.tables[0])
  assert type(translated) is E.SGD


def test_clipvalue_and_weight_decay_carry_over():
  t = keras_optimizers.translate(K.AdamW(0.01, weight_decay=0.004, clipvalue=2))
  assert type(t.optimizer) is E.Adam
  assert t.optimizer.weight_decay_factor == pytest.approx(0.004)
  assert t.optimizer.multiply_weight_decay_factor_by_learning_rate
  assert (t.optimizer.clip_gradient_min, t.optimizer.clip_gradient_max) == (
    -2.0,
    2.0,
  )


def test_names_and_embedding_optimizers_pass_and_the_rest_is_refused():
  for name, cls in keras_optimizers.OPTIMIZER_NAMES.items():
    assert type(layers.embedding_optimizer(name.upper())) is cls
  mine = E.Adagrad(0.3)
  assert layers.embedding_optimizer(mine) is mine
  assert layers.embedding_optimizer(None) is None
  with pytest.raises(ValueError, match="'sgd', 'adagrad', 'adam', 'ftrl'"):
    layers.embedding_optimizer("adadelta")
  with pytest.raises(ValueError, match="RMSprop.*no embedding-optimizer"):
    layers.embedding_optimizer(K.RMSprop())
  with pytest.raises(ValueError, match="expected a tf.tpu.experimental"):
    layers.embedding_optimizer(0.1)


def test_the_learning_rate_is_read_from_the_keras_optimizer_at_each_step():
  # A variable a callback changes (ReduceLROnPlateau does this).
  adagrad = K.Adagrad(0.1)
  lr = keras_optimizers.translate(adagrad).optimizer.learning_rate
  adagrad.learning_rate = 0.02
  assert float(lr()) == pytest.approx(0.02)
  legacy = KL.Adagrad(0.1)
  lr = keras_optimizers.translate(legacy).optimizer.learning_rate
  keras.backend.set_value(legacy.lr, 0.03)
  assert float(lr()) == pytest.approx(0.03)
  # A schedule at the optimizer's iterations; legacy decay too.
  schedule = K.schedules.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
  for opt in (K.SGD(schedule), KL.SGD(schedule)):
    lr = keras_optimizers.translate(opt).optimizer.learning_rate
    opt.iterations.assign(3)
    assert float(lr()) == pytest.approx(0.125)
  decayed = KL.SGD(1.0, decay=0.5)
  lr = keras_optimizers.translate(decayed).optimizer.learning_rate
  decayed.iterations.assign(2)
  assert float(lr()) == pytest.approx(1.0 / (1.0 + 0.5 * 2))


def _config(table_optimizer=None):
  users = E.TableConfig(13, 5, name="users", optimizer=table_optimizer)
  movies = E.TableConfig(17, 3, name="movies")
  return {
    "user": E.FeatureConfig(users, name="user"),
    "movie": E.FeatureConfig(movies, name="movie"),
  }


def test_a_table_optimizer_is_translated_on_a_copy_of_the_table(caplog):
  keras_adam = K.Adam(0.01)
  config = _config(table_optimizer=keras_adam)
  with caplog.at_level(logging.INFO, logger="recsys.layers"):
    emb = layers.Embedding(config, K.Adagrad(0.1))
  users = config["user"].table
  assert users.optimizer is keras_adam  # the user's config is unchanged
  assert set(emb.embedding_tables) == {users, config["movie"].table}
  by_name = {emb.embedding.table_name(t): t for t in emb.embedding.tables}
  assert type(by_name["users"].optimizer) is E.Adam
  assert by_name["movies"].optimizer is None  # the layer's default: Adagrad
  assert type(emb.embedding.optimizer_for(by_name["movies"])) is E.Adagrad
  # One line per table says what it became; one more what was not kept.
  notes = [r.getMessage() for r in caplog.records]
  assert sum("table 'users': trained by Adam" in n for n in notes) == 1
  assert sum("table 'movies': trained by Adagrad" in n for n in notes) == 1
  assert sum("'movies'" in n and "epsilon=1e-07" in n for n in notes) == 1
  assert sum("'users'" in n and "bias correction" in n for n in notes) == 1


def test_a_shared_keras_optimizer_trains_the_tables_with_tpu_math_only():
  """One Keras Adagrad for the layer and compile(), as TFRS's tutorial.

  The tables follow the NumPy TPU Adagrad with the Keras optimizer's
  learning rate and initial accumulator; the Keras optimizer steps once per
  batch and holds slots for the dense variables only.
  """
  rng = np.random.default_rng(0)
  config = _config()
  shared = K.Adagrad(0.2, initial_accumulator_value=0.5)
  emb = layers.Embedding(config, shared)
  inputs = {k: keras.Input([], dtype=tf.int64, name=k) for k in config}
  acts = emb(inputs)
  dense = keras.layers.Dense(1, use_bias=False, trainable=False)
  model = keras.Model(
    inputs, dense(tf.concat([acts["user"], acts["movie"]], 1))
  )
  model.compile(optimizer=shared, loss="mse")
  tables = {
    t.name: rng.normal(size=(t.vocabulary_size, t.dim)).astype("float32")
    for t in emb.embedding_tables
  }
  for t, var in emb.embedding_tables.items():
    var.assign(tables[t.name])
  kernel = dense.kernel.numpy().astype(np.float64)
  x = {"user": rng.integers(0, 13, 6), "movie": rng.integers(0, 17, 6)}
  y = rng.normal(size=(6, 1)).astype("float32")
  model.fit(x, y, batch_size=6, epochs=1, verbose=0, shuffle=False)

  pred = (
    np.concatenate(
      [tables["users"][x["user"]], tables["movies"][x["movie"]]], 1
    )
    @ kernel
  )
  d_acts = (2.0 * (pred - y) / 6) @ kernel.T
  want_opt = E.Adagrad(0.2, initial_accumulator_value=0.5)
  for feature, table, cols in (
    ("user", "users", slice(0, 5)),
    ("movie", "movies", slice(5, 8)),
  ):
    want, _ = ref.first_step(
      want_opt, tables[table], x[feature], d_acts[:, cols]
    )
    got = [v for t, v in emb.embedding_tables.items() if t.name == table][0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
  assert int(shared.iterations.numpy()) == 1
  table_shapes = {tuple(t.shape) for t in tables.values()}
  assert not any(tuple(v.shape) in table_shapes for v in shared.variables)


# -- a schedule on the layer's own Keras optimizer ----------------------------


def _halving():
  """lr(n) = 0.5 ** (n + 1): each step's update is half the last one's."""
  return K.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5)


def _scheduled_reference(config, tables, dense_values, x, y):
  """The backend's own loop with SGD at schedule(n) in step n (NumPy-free:
  the schedule's own value; the dense layer is frozen)."""
  from tests.layers import test_embedding_layer as t  # pylint: disable=g-import-not-at-top

  schedule, step = _halving(), tf.Variable(0.0)
  emb = backends.create(
    config, E.SGD(lambda: schedule(step)), backend="tensorcore"
  )
  emb.build()
  dense = keras.layers.Dense(1)
  dense.build([None, 18])
  t.set_values(emb.embedding_tables, dense, tables, dense_values)
  for n in range(t.STEPS):
    rows = slice(n * t.BATCH, (n + 1) * t.BATCH)
    with tf.GradientTape() as tape:
      ids = {k: tf.constant(v[rows]) for k, v in x.items()}
      acts = emb.lookup(ids, training=True)
      pred = dense(tf.concat([acts["user"], acts["movie"]], -1))
      loss = tf.reduce_mean(tf.square(pred - y[rows]))
    emb.apply_gradients(tape.gradient(loss, acts))
    step.assign_add(1.0)
  return {c.name: v.numpy() for c, v in emb.embedding_tables.items()}


@pytest.mark.parametrize(
  "pattern, replicas",
  [
    ("layer_only", 1),
    ("layer_only", 2),
    ("shared_with_compile", 1),
    ("tfrs_custom_loop", 1),
  ],
)
def test_the_tables_learning_rate_at_step_n_is_the_schedule_at_n(
  pattern, replicas
):
  """TFRS's separate embedding optimizer: `Embedding(..., optimizer=
  SGD(schedule))` while `compile()` has another. Nothing applies the
  layer's optimizer, so its `iterations` stays 0: the tables trained at
  schedule(0) forever. The layer counts its own steps (and a shared
  optimizer, or one a loop applies, still counts each step once)."""
  from tests.conftest import mirrored_strategy  # pylint: disable=g-import-not-at-top
  from tests.layers import test_embedding_layer as t  # pylint: disable=g-import-not-at-top

  strategy = (
    tf.distribute.get_strategy()
    if replicas == 1
    else mirrored_strategy(replicas)
  )
  config = t.feature_config()
  tables, dense_values = t.initial_values(config)
  x, y = t.data()
  with strategy.scope():
    layer_opt = K.SGD(_halving())
    emb = layers.Embedding(config, layer_opt)
    model = t.ranking_model(emb, dense_trainable=False)
    shared = pattern == "shared_with_compile"
    model.compile(optimizer=layer_opt if shared else K.SGD(0.05), loss="mse")
  t.set_values(emb.embedding_tables, model.layers[-1], tables, dense_values)
  if pattern == "tfrs_custom_loop":
    # TFRS's docstring: the embedding optimizer applied to the layer's
    # trainable variables each step, which advances its iterations.
    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(features) - labels))
      grads = tape.gradient(loss, emb.trainable_variables)
      layer_opt.apply_gradients(zip(grads, emb.trainable_variables))

    for n in range(t.STEPS):
      rows = slice(n * t.BATCH, (n + 1) * t.BATCH)
      step({k: tf.constant(v[rows]) for k, v in x.items()}, y[rows])
  else:
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(t.BATCH)
    model.fit(ds, epochs=1, verbose=0, shuffle=False)

  want = _scheduled_reference(config, tables, dense_values, x, y)
  for c, var in emb.embedding_tables.items():
    np.testing.assert_allclose(var.numpy(), want[c.name], rtol=1e-5, atol=1e-6)
  # The Keras object is only read: its iterations count what applies it.
  iterations = int(layer_opt.iterations.numpy())
  assert iterations == (0 if pattern == "layer_only" else t.STEPS)
  counts = [w for w in emb.weights if "keras_schedule_step" in w.name]
  assert [int(w.numpy()) for w in counts] == [t.STEPS]


def test_a_resumed_fit_continues_the_layers_schedule(tmp_path):
  """The layer's step count is one of its weights: `save_weights` after 2
  steps, a new model loads them and 2 more steps match 4 in one go."""
  from tests.layers import test_embedding_layer as t  # pylint: disable=g-import-not-at-top

  config = t.feature_config()
  tables, dense_values = t.initial_values(config)
  x, y = t.data()
  ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(t.BATCH)
  half = t.STEPS // 2

  def model():
    emb = layers.Embedding(config, K.SGD(_halving()))
    made = t.ranking_model(emb, dense_trainable=False)
    made.compile(optimizer=K.SGD(0.05), loss="mse")
    return made, emb

  first, emb = model()
  t.set_values(emb.embedding_tables, first.layers[-1], tables, dense_values)
  first.fit(ds.take(half), epochs=1, verbose=0, shuffle=False)
  first.save_weights(str(tmp_path / "half"))
  second, emb = model()
  second.load_weights(str(tmp_path / "half"))
  second.fit(ds.skip(half), epochs=1, verbose=0, shuffle=False)
  want = _scheduled_reference(config, tables, dense_values, x, y)
  for c, var in emb.embedding_tables.items():
    np.testing.assert_allclose(var.numpy(), want[c.name], rtol=1e-5, atol=1e-6)
