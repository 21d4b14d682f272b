"""recsys.layers.Embedding under Keras mixed precision, as a user writes it.

`set_global_policy("mixed_float16")` makes `compile()` wrap the optimizer in
a `LossScaleOptimizer`: the loss is multiplied by 2**15 before Keras
differentiates it. The tables must get the true gradient, skip the steps
the loss scaler skips, and end where a float32 run ends (within float16's
precision). References: the same model, data and initial values trained in
float32; Keras's own loss scale and dense weights for the skipped steps.
"""

import contextlib
import logging

import numpy as np
import pytest
import tensorflow_recommenders as tfrs

from recsys import layers
from recsys._keras import keras, tf
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
USERS, MOVIES, DIM, BATCH, STEPS = 11, 13, 4, 8, 4


@contextlib.contextmanager
def policy(name):
  keras.mixed_precision.set_global_policy(name)
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy("float32")


def config():
  return {
    "user": E.FeatureConfig(E.TableConfig(USERS, DIM, name="users")),
    "movie": E.FeatureConfig(E.TableConfig(MOVIES, DIM, name="movies")),
  }


def data(seed=0, label_scale=0.5):
  rng = np.random.default_rng(seed)
  n = BATCH * STEPS
  x = {"user": rng.integers(0, USERS, n), "movie": rng.integers(0, MOVIES, n)}
  y = (label_scale * rng.normal(size=(n, 1))).astype("float32")
  return x, y


def initial(table_scale=0.3, kernel_scale=0.3):
  rng = np.random.default_rng(1)
  tables = {
    "users": table_scale * rng.normal(size=(USERS, DIM)),
    "movies": table_scale * rng.normal(size=(MOVIES, DIM)),
  }
  kernel = kernel_scale * rng.normal(size=(2 * DIM, 1))
  return (
    {k: v.astype("float32") for k, v in tables.items()},
    [kernel.astype("float32"), np.zeros([1], "float32")],
  )


class RatingModel(tfrs.models.Model):
  """TFRS's shape: its `train_step` differentiates the loss unscaled."""

  def __init__(self, emb):
    super().__init__()
    self.emb, self.score = emb, keras.layers.Dense(1)
    self.task = tfrs.tasks.Ranking(loss=keras.losses.MeanSquaredError())

  def call(self, x):
    acts = self.emb(x)
    return self.score(tf.concat([acts["user"], acts["movie"]], 1))

  def compute_loss(self, inputs, training=False):
    x, y = inputs
    return self.task(labels=y, predictions=tf.cast(self(x), tf.float32))


class ScaledStepModel(keras.Model):
  """A custom `train_step` as Keras's mixed-precision guide writes it."""

  def train_step(self, data):
    x, y = data
    scaling = isinstance(
      self.optimizer, keras.mixed_precision.LossScaleOptimizer
    )
    with tf.GradientTape() as tape:
      loss = self.compiled_loss(y, self(x, training=True))
      scaled = self.optimizer.get_scaled_loss(loss) if scaling else loss
    variables = self.trainable_variables
    grads = tape.gradient(scaled, variables)
    if scaling:
      grads = self.optimizer.get_unscaled_gradients(grads)
    self.optimizer.apply_gradients(zip(grads, variables))
    return {"loss": loss}


def build(kind, optimizer):
  """(model, layer, dense) of `kind`, compiled with `optimizer`."""
  emb = layers.Embedding(config(), E.SGD(0.5))
  if kind == "tfrs":
    model = RatingModel(emb)
    model.compile(optimizer=optimizer)
    model({"user": tf.constant([0]), "movie": tf.constant([0])})
    return model, emb, model.score
  inputs = {k: keras.Input([], dtype=tf.int64, name=k) for k in config()}
  acts = emb(inputs)
  dense = keras.layers.Dense(1)
  # The output in float32, as the mixed-precision guide says.
  out = keras.layers.Activation("linear", dtype="float32")(
    dense(tf.concat([acts["user"], acts["movie"]], 1))
  )
  cls = ScaledStepModel if kind == "custom_step" else keras.Model
  model = cls(inputs, out)
  model.compile(optimizer=optimizer, loss="mse")
  return model, emb, dense


def fit(kind, policy_name, strategy=None, optimizer=None, **values):
  """Tables, dense weights and the compiled optimizer after one epoch."""
  strategy = strategy or tf.distribute.get_strategy()
  x, y = data(label_scale=values.pop("label_scale", 0.5))
  tables, dense_values = initial(**values)
  with policy(policy_name), strategy.scope():
    model, emb, dense = build(kind, optimizer or keras.optimizers.SGD(0.1))
  for c, var in emb.embedding_tables.items():
    var.assign(tables[c.name])
  dense.set_weights(dense_values)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
  model.fit(ds, epochs=1, verbose=0)
  got = {c.name: v.numpy() for c, v in emb.embedding_tables.items()}
  return got, dense.get_weights(), model.optimizer, emb


_FLOAT32: dict = {}


def fit_float32(kind, strategy=None):
  """`fit(kind, "float32", strategy)`'s tables and dense weights, once per
  module for each (kind, strategy): the reference of several tests."""
  strategy = strategy or tf.distribute.get_strategy()
  key = (kind, strategy.num_replicas_in_sync)
  if key not in _FLOAT32:
    got, dense, _, _ = fit(kind, "float32", strategy)
    _FLOAT32[key] = got, dense
  return _FLOAT32[key]


def assert_close_to_float32(got, want, dense, dense_want, tol):
  for name, value in got.items():
    assert np.isfinite(value).all(), name
    np.testing.assert_allclose(value, want[name], atol=tol, rtol=tol)
  for value, expected in zip(dense, dense_want):
    np.testing.assert_allclose(value, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize(
  "kind, replicas",
  [
    ("keras", 1),
    pytest.param("keras", 2, marks=pytest.mark.slow),
    ("tfrs", 1),
    ("custom_step", 1),
  ],
)
def test_mixed_float16_fit_trains_the_tables_as_float32_does(kind, replicas):
  """Keras scales the loss by 2**15: the tables must see the true gradient
  (before: every touched row non-finite after 4 steps)."""
  strategy = (
    tf.distribute.get_strategy()
    if replicas == 1
    else mirrored_strategy(replicas)
  )
  want, dense_want = fit_float32(kind, strategy)
  got, dense, optimizer, emb = fit(kind, "mixed_float16", strategy)
  assert isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
  assert float(optimizer.loss_scale) == 2.0**15  # no step was skipped
  assert_close_to_float32(got, want, dense, dense_want, tol=3e-4)
  initial_tables, _ = initial()
  assert not np.allclose(got["users"], initial_tables["users"])  # it trained
  out = emb({"user": tf.constant([1]), "movie": tf.constant([2])})
  assert out["user"].dtype == tf.float16  # the policy's compute dtype


def test_mixed_bfloat16_needs_no_loss_scale_and_tracks_float32():
  want, dense_want = fit_float32("keras")
  got, dense, optimizer, emb = fit("keras", "mixed_bfloat16")
  assert not isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
  # bfloat16 keeps 8 bits of mantissa: 2**-8 relative to the values.
  assert_close_to_float32(got, want, dense, dense_want, tol=3e-3)
  out = emb({"user": tf.constant([1]), "movie": tf.constant([2])})
  assert out["user"].dtype == tf.bfloat16


@pytest.mark.parametrize("legacy", [False, True], ids=["keras2", "legacy"])
def test_a_step_the_loss_scaler_skips_leaves_the_tables_too(legacy):
  """Labels so large that the scaled gradients overflow float16 in every
  step: Keras skips each step and halves its scale; the tables stay."""
  sgd = (keras.optimizers.legacy if legacy else keras.optimizers).SGD(0.1)
  got, dense, optimizer, _ = fit(
    "keras", "mixed_float16", optimizer=sgd, label_scale=1e4
  )
  tables, dense_values = initial()
  assert float(optimizer.loss_scale) == 2.0 ** (15 - STEPS)
  for name, value in got.items():
    np.testing.assert_array_equal(value, tables[name])
  for value, before in zip(dense, dense_values):
    np.testing.assert_array_equal(value, before)


def test_tables_whose_gradients_alone_overflow_make_keras_skip_the_step():
  """Tiny tables, a large kernel: d(loss)/d(activations) overflows float16
  (~2e6 at the first scale) while the dense gradients do not (< 2e4). Keras
  sees the tables' overflow (the trap's gradient is NaN): it skips the dense
  update too and halves the scale; without that the dense layer would
  train at a scale under which the tables never could."""
  values = dict(table_scale=1e-4, kernel_scale=1e3, label_scale=0.0)
  got, dense, optimizer, _ = fit("keras", "mixed_float16", **values)
  tables, dense_values = initial(table_scale=1e-4, kernel_scale=1e3)
  assert float(optimizer.loss_scale) == 2.0 ** (15 - STEPS)
  for name, value in got.items():
    np.testing.assert_array_equal(value, tables[name])
  for value, before in zip(dense, dense_values):
    np.testing.assert_array_equal(value, before)


def test_a_custom_loop_scaling_by_hand_is_warned_and_compute_gradients_works(
  caplog,
):
  """A bare loop: `get_scaled_loss` + `tape.gradient` cannot be seen (the
  tables would take the scaled gradient), so the layer says so and what to
  do; the loop written with `compute_gradients` matches float32."""
  x, y = data()
  tables, dense_values = initial()

  def run(policy_name, by_hand):
    with policy(policy_name):
      model, emb, dense = build("keras", keras.optimizers.SGD(0.1))
      opt = keras.optimizers.SGD(0.1)
      if policy_name == "mixed_float16":
        opt = keras.mixed_precision.LossScaleOptimizer(opt)
    for c, var in emb.embedding_tables.items():
      var.assign(tables[c.name])
    dense.set_weights(dense_values)

    @tf.function
    def step(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        if by_hand:
          loss = opt.get_scaled_loss(loss)
      variables = model.trainable_variables
      if by_hand:
        grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
        opt.apply_gradients(zip(grads, variables))
      else:
        opt.apply_gradients(opt.compute_gradients(loss, variables, tape))

    for i in range(STEPS):
      rows = slice(i * BATCH, (i + 1) * BATCH)
      step({k: v[rows] for k, v in x.items()}, y[rows])
    return {c.name: v.numpy() for c, v in emb.embedding_tables.items()}

  want = run("float32", by_hand=False)
  with caplog.at_level(logging.WARNING, logger="recsys.layers"):
    got = run("mixed_float16", by_hand=False)
  assert not [r for r in caplog.records if r.name == "recsys.layers"]
  for name, value in got.items():
    np.testing.assert_allclose(value, want[name], atol=3e-4, rtol=3e-4)
  with caplog.at_level(logging.WARNING, logger="recsys.layers"):
    run("mixed_float16", by_hand=True)
  said = [r.getMessage() for r in caplog.records if r.name == "recsys.layers"]
  assert len(said) == 1
  assert "get_scaled_loss" in said[0] and "compute_gradients" in said[0]
