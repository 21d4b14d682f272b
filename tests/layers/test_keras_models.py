"""The bundled models under `fit`, and the Trainer on a FeatureConfig + Dataset.

The reference for `fit` is the Trainer: the same DLRM, feature_config, data,
optimizers and initial values give the same tables, slots and dense weights
after one epoch, on 1 and 2 mirrored replicas.
"""

import functools

import numpy as np
import pytest

from recsys import layers
from recsys._keras import keras, tf
from recsys.data.sources import SourceSettingsError
from recsys.models import DLRM, FactorizationMachine, TwoTower
from recsys.models.keras_model import KerasRecommender
from recsys.training import Trainer, TrainerConfigError
from tests.conftest import mirrored_strategy
from tests.training.few_steps import few_steps

E = tf.tpu.experimental.embedding
USERS, MOVIES, BATCH, STEPS = 23, 29, 8, 4


def config():
  return {
    "user": E.FeatureConfig(E.TableConfig(USERS, 8, name="users"), name="user"),
    "movie": E.FeatureConfig(
      E.TableConfig(MOVIES, 8, name="movies"), name="movie"
    ),
  }


def ratings(n=BATCH * STEPS, seed=0):
  """A user's own unbatched dataset: ({"user", "movie"}, rating)."""
  rng = np.random.default_rng(seed)
  x = {"user": rng.integers(0, USERS, n), "movie": rng.integers(0, MOVIES, n)}
  y = rng.uniform(1, 5, size=n).astype("float32")
  return tf.data.Dataset.from_tensor_slices((x, y))


DLRM_ARGS = dict(objective="mse", bottom_mlp=(8,), top_mlp=(8,))


@pytest.mark.parametrize("replicas", [1, 2])
def test_fit_equals_the_trainer(tmp_path, replicas):
  strategy = (
    tf.distribute.get_strategy()
    if replicas == 1
    else mirrored_strategy(replicas)
  )
  trainer = Trainer(
    str(tmp_path),
    source=ratings(),
    feature_config=config(),
    model=functools.partial(DLRM, **DLRM_ARGS),
    strategy=strategy,
    embedding_optimizer=E.Adagrad(0.1),
    dense_optimizer=lambda: keras.optimizers.SGD(0.05),
    backend="tensorcore",
    **few_steps(
      global_batch_size=BATCH, train_steps=STEPS, steps_per_loop=STEPS
    ),
  )
  tables = {
    c.name: v.numpy() for c, v in trainer.backend.embedding_tables.items()
  }
  dense = trainer.model.get_weights()

  with strategy.scope():
    model = KerasRecommender.build(
      DLRM, config(), E.Adagrad(0.1), backend="tensorcore", **DLRM_ARGS
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05))
  for c, var in model.embedding.embedding_tables.items():
    var.assign(tables[c.name])
  model.model.set_weights(dense)
  history = model.fit(ratings().batch(BATCH), epochs=1, verbose=0)
  trainer.train()

  for c, var in model.embedding.embedding_tables.items():
    want = [
      v for t, v in trainer.backend.embedding_tables.items() if t.name == c.name
    ][0]
    np.testing.assert_allclose(var.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(var.numpy(), tables[c.name])
  for table, slots in model.embedding.embedding.slot_variables().items():
    for name, var in slots.items():
      np.testing.assert_allclose(
        var.numpy(),
        trainer.backend.slot_variables()[table][name].numpy(),
        rtol=1e-5,
        atol=1e-6,
      )
  for got, want in zip(model.model.get_weights(), trainer.model.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.isfinite(history.history["loss"]).all()

  # The Trainer's checkpoint -> a fresh layer (its `embedding=` node).
  path = trainer.save()
  fresh = layers.Embedding(config(), E.Adagrad(0.1))
  fresh.build(None)
  tf.train.Checkpoint(embedding=fresh.embedding).restore(path).expect_partial()
  for table, slots in trainer.backend.slot_variables().items():
    got = fresh.embedding.slot_variables()[table]
    for name, var in slots.items():
      np.testing.assert_array_equal(got[name].numpy(), var.numpy())
  for c, var in trainer.backend.embedding_tables.items():
    got = [v for t, v in fresh.embedding_tables.items() if t.name == c.name][0]
    np.testing.assert_array_equal(got.numpy(), var.numpy())


def test_two_tower_fits_evaluates_and_predicts_on_a_feature_dict_dataset():
  model = KerasRecommender.build(
    TwoTower,
    config(),
    E.Adagrad(0.1),
    query_features=["user"],
    candidate_features=["movie"],
    query_tower=(8,),
    candidate_tower=(8,),
  )
  model.compile(optimizer=keras.optimizers.Adam(0.01))
  ds = ratings().batch(BATCH)
  before = model.embedding.embedding_tables
  before = {c.name: v.numpy() for c, v in before.items()}
  history = model.fit(ds, epochs=2, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]
  for c, var in model.embedding.embedding_tables.items():
    assert not np.allclose(var.numpy(), before[c.name])
  assert np.isfinite(model.evaluate(ds, verbose=0, return_dict=True)["loss"])
  assert model.predict(ds, verbose=0).shape == (BATCH * STEPS,)


def test_trainer_refuses_a_dataset_without_feature_config(tmp_path):
  # Refused where datasets become sources (recsys.data.sources): a settings
  # error of the data layer, exit status 2 like TrainerConfigError.
  with pytest.raises(SourceSettingsError, match="needs feature_config"):
    Trainer(str(tmp_path), source=ratings(), model=DLRM, progress_bar=False)


def _policy_run(policy, run):
  keras.mixed_precision.set_global_policy(policy)
  try:
    return run()
  finally:
    keras.mixed_precision.set_global_policy("float32")


def test_the_trainer_refuses_float16_which_it_does_not_loss_scale(tmp_path):
  """The Trainer differentiates the loss unscaled: under mixed_float16 small
  gradients would round to 0 (an FM, which computes in float32, trained
  without a word before)."""

  def trainer():
    return Trainer(
      str(tmp_path),
      source=ratings(),
      feature_config=config(),
      model=functools.partial(FactorizationMachine, objective="mse"),
      global_batch_size=BATCH,
      train_steps=1,
      progress_bar=False,
      summaries=False,
    )

  with pytest.raises(TrainerConfigError, match="float16.*loss scaling"):
    _policy_run("mixed_float16", trainer)


def test_a_bundled_model_fits_under_mixed_float16_as_in_float32():
  """KerasRecommender gives its model float32 activations, as the Trainer
  does, and scales the loss as Keras's train_step does."""

  def fit(policy):
    def run():
      model = KerasRecommender.build(
        FactorizationMachine, config(), E.Adagrad(0.1), objective="mse"
      )
      for c, var in model.embedding.embedding_tables.items():
        var.assign(tf.fill(var.shape, 0.1 if c.name == "users" else 0.2))
      model.compile(optimizer=keras.optimizers.SGD(0.05))
      model.fit(ratings().batch(BATCH), epochs=1, verbose=0)
      assert isinstance(
        model.optimizer, keras.mixed_precision.LossScaleOptimizer
      ) == (policy == "mixed_float16")
      return {
        c.name: v.numpy() for c, v in model.embedding.embedding_tables.items()
      }

    return _policy_run(policy, run)

  want, got = fit("float32"), fit("mixed_float16")
  for name, value in got.items():
    assert not np.allclose(value, 0.1 if name == "users" else 0.2)
    # FM's few float16 ops: measured 3e-5 apart at most.
    np.testing.assert_allclose(value, want[name], rtol=1e-3, atol=2e-4)


def test_a_batched_dataset_or_a_missing_feature_is_refused_by_name():
  from recsys.data import DatasetSource  # pylint: disable=g-import-not-at-top

  with pytest.raises(ValueError, match="looks batched already"):
    DatasetSource(ratings().batch(4), config())
  wrong = ratings().map(lambda x, y: ({"user": x["user"]}, y))
  with pytest.raises(ValueError, match=r"no features \['movie'\]"):
    DatasetSource(wrong, config())
