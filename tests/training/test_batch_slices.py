"""The dense part on slices of the batch (`train.batch_slices`): the same
training as the whole batch, picked only where it is safe, refused where it
would change the loss."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from recsys._keras import keras
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec
from recsys.models import DLRM, LossInputs, TwoTower
from recsys.training import TrainerConfigError
from recsys.training import batch_slices as slices_lib
from tests.conftest import mirrored_strategy
from tests.training.test_trainer import assert_same_state, make_trainer, state

embedding = tf.tpu.experimental.embedding
SPECS = [FeatureSpec("user", 50), FeatureSpec("item", 60)]


def _trained(tmp_path, name, **kwargs):
  trainer = make_trainer(
    tmp_path / name,
    train_steps=4,
    optimizer=embedding.Adam(0.01),
    **kwargs,
  )
  return trainer, trainer.train()


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """(state, metrics) of 4 steps on the whole batch: what every cut run is
  compared with."""
  trainer, metrics = _trained(
    tmp_path_factory.mktemp("whole"), "run", batch_slices=1
  )
  assert trainer.steps.batch_slices == 1
  return state(trainer.run), metrics


@pytest.mark.parametrize("slices", [2, 3])  # 3: slices of 3, 3 and 4
def test_sliced_steps_train_as_the_whole_batch(tmp_path, whole, slices):
  """Tables, slots, dense weights, optimizer state and the metrics after 4
  steps equal the whole batch's (summed in another order: float32 noise)."""
  whole_state, whole_metrics = whole
  cut, cut_metrics = _trained(tmp_path, "cut", batch_slices=slices)
  assert cut.steps.batch_slices == slices
  assert_same_state(state(cut.run), whole_state, rtol=2e-5, atol=1e-6)
  for key in ("train/loss", "eval/loss", "eval/auc"):
    np.testing.assert_allclose(
      cut_metrics[key], whole_metrics[key], rtol=1e-5, err_msg=key
    )


@pytest.mark.slow
def test_sliced_steps_on_two_replicas_and_compiled_match_one_whole_batch(
  tmp_path, whole
):
  """2 CPU replicas with 2 slices each, and the XLA-compiled step with 2
  slices, train as 1 replica on the whole batch."""
  two, _ = _trained(
    tmp_path, "two", strategy=mirrored_strategy(2), batch_slices=2
  )
  compiled, _ = _trained(tmp_path, "xla", batch_slices=2, jit_compile=True)
  assert compiled.steps.jit_compile
  assert_same_state(state(two.run), whole[0], rtol=2e-5, atol=1e-6)
  assert_same_state(state(compiled.run), whole[0], rtol=2e-5, atol=1e-6)


def test_the_trainer_logs_its_slices(tmp_path, caplog):
  with caplog.at_level(logging.INFO, logger="recsys.training"):
    make_trainer(tmp_path, batch_slices=2)
  assert "loss on 2 slice(s) of each batch: as set" in caplog.text


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "2"])
def test_a_slice_count_that_is_no_positive_int_is_refused(tmp_path, bad):
  with pytest.raises(SettingsError, match=r"batch_slices must be an int"):
    make_trainer(tmp_path, batch_slices=bad)


def test_more_slices_than_a_replica_has_examples_is_refused(tmp_path):
  with pytest.raises(TrainerConfigError, match="more than the 5 examples"):
    make_trainer(tmp_path, strategy=mirrored_strategy(2), batch_slices=6)


def _resolve(
  model, setting=None, strategy=None, compiled=False, batch=1024, cores=2
):
  return slices_lib.resolve(
    setting,
    model,
    strategy or tf.distribute.get_strategy(),
    compiled,
    batch,
    cores=cores,
  )


def test_auto_cuts_a_ranking_models_batch_where_a_second_core_is_free():
  dlrm = DLRM(SPECS, num_dense=2, bottom_mlp=(4,), top_mlp=(4,))
  assert _resolve(dlrm).slices == slices_lib.AUTO_SLICES == 2
  assert _resolve(dlrm, cores=8).slices == 2
  for why, plan in {
    "1 CPU core": _resolve(dlrm, cores=1),
    "XLA-compiled": _resolve(dlrm, compiled=True),
    "200 examples per replica": _resolve(dlrm, batch=200),
    "1 CPU core(s) per replica": _resolve(
      dlrm, strategy=mirrored_strategy(2), cores=2
    ),
  }.items():
    assert plan.slices == 1 and why in plan.reason, (why, plan)
  assert _resolve(dlrm, strategy=mirrored_strategy(2), cores=4).slices == 2
  assert _resolve(dlrm, setting=3, cores=1).slices == 3  # as set


def test_a_model_whose_examples_share_a_loss_is_never_cut():
  """In-batch negatives: a two-tower's loss of each example depends on the
  batch. Auto leaves it whole; asking for slices is refused, naming it."""
  tower = TwoTower(SPECS, query_features=["user"], candidate_features=["item"])
  plan = _resolve(tower)
  assert plan.slices == 1 and "TwoTower" in plan.reason
  with pytest.raises(
    TrainerConfigError, match="TwoTower.*EXAMPLES_INDEPENDENT"
  ):
    _resolve(tower, setting=2)
  assert _resolve(tower, setting=1).slices == 1


def test_a_layer_with_batch_statistics_keeps_the_batch_whole():
  class NormalizedDLRM(DLRM):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      self.norm = keras.layers.BatchNormalization(name="dense_norm")

  model = NormalizedDLRM(SPECS, num_dense=2, bottom_mlp=(4,), top_mlp=(4,))
  plan = _resolve(model)
  assert plan.slices == 1 and "BatchNormalization: dense_norm" in plan.reason
  with pytest.raises(TrainerConfigError, match="dense_norm"):
    _resolve(model, setting=2)


class _Penalty(keras.layers.Layer):
  """A user's layer that adds a loss of its input (add_loss)."""

  def call(self, x):
    self.add_loss(0.01 * tf.reduce_mean(tf.square(x)))
    return x


class _Scaled(keras.layers.Layer):
  """A user's per-example layer; `EXAMPLES_INDEPENDENT` says so or not."""

  def call(self, x):
    return 2.0 * x


class _Declared(_Scaled):
  EXAMPLES_INDEPENDENT = True


def _with_layer(layer):
  """A DLRM with `layer` among its layers (called on a batch once)."""
  model = DLRM(SPECS, num_dense=2, bottom_mlp=(4,), top_mlp=(4,))
  model.extra = layer
  layer(tf.zeros([3, 4]))
  return model


@pytest.mark.parametrize(
  "layer,named",
  [
    (keras.layers.experimental.SyncBatchNormalization(name="sync"), "sync"),
    (
      keras.layers.Dense(
        4, name="act", activity_regularizer=keras.regularizers.L2(0.1)
      ),
      "act (activity_regularizer)",
    ),
    (_Penalty(name="penalty"), "penalty (add_loss)"),
  ],
  ids=["sync-batch-norm", "activity-regularizer", "add-loss"],
)
def test_layers_that_couple_the_batch_keep_it_whole(layer, named):
  """SyncBatchNormalization is no BatchNormalization subclass; the others
  leave Keras only the last slice's losses."""
  plan = _resolve(_with_layer(layer))
  assert plan.slices == 1 and named in plan.reason, plan
  with pytest.raises(TrainerConfigError, match=named.split(" ")[0]):
    _resolve(_with_layer(layer), setting=2)


def test_a_layer_the_project_cannot_see_into_is_cut_only_when_declared():
  plan = _resolve(_with_layer(_Scaled(name="mine")))
  assert plan.slices == 1 and "cannot see into (_Scaled: mine)" in plan.reason
  with pytest.raises(TrainerConfigError, match="EXAMPLES_INDEPENDENT = True"):
    _resolve(_with_layer(_Scaled(name="mine")), setting=2)
  assert _resolve(_with_layer(_Declared(name="mine"))).slices == 2


def test_every_kind_of_batch_tensor_is_cut_into_its_rows():
  dense = tf.reshape(tf.range(14), [7, 2])
  ragged = tf.ragged.constant([[1], [], [2, 3], [4], [5, 6, 7], [], [8]])
  sparse = ragged.to_sparse()
  ranges = slices_lib.bounds(7, 3)
  assert ranges == [(0, 2), (2, 4), (4, 7)]
  pieces = slices_lib._cut(  # pylint: disable=protected-access
    {"d": dense, "r": ragged, "s": sparse, "none": None}, ranges
  )
  for piece, (begin, end) in zip(pieces, ranges):
    np.testing.assert_array_equal(piece["d"], dense[begin:end])
    assert piece["r"].to_list() == ragged[begin:end].to_list()
    assert tf.RaggedTensor.from_sparse(piece["s"]).to_list() == (
      ragged[begin:end].to_list()
    )
    assert piece["none"] is None


def test_a_batch_of_unknown_size_is_cut_at_run_time():
  """A last, smaller batch (no static size): the slices are computed in the
  graph and the losses are the whole batch's."""
  model = DLRM(SPECS, num_dense=2, bottom_mlp=(4,), top_mlp=(4,))
  rng = np.random.default_rng(0)
  acts = {
    n: tf.constant(rng.normal(size=(9, 4)), tf.float32)
    for n in ("user", "item")
  }
  features = {"dense": tf.constant(rng.normal(size=(9, 2)), tf.float32)}
  labels = tf.constant(rng.integers(0, 2, 9), tf.float32)
  whole = model.per_example_loss(
    LossInputs(acts, features, labels, compute_metrics=False)
  )
  spec = tf.TensorSpec([None, 4], tf.float32)

  @tf.function(
    input_signature=[
      {"user": spec, "item": spec},
      {"dense": tf.TensorSpec([None, 2], tf.float32)},
      tf.TensorSpec([None], tf.float32),
    ]
  )
  def sliced(a, f, y):
    return slices_lib.per_example_loss(model, LossInputs(a, f, y), 2)

  np.testing.assert_allclose(sliced(acts, features, labels), whole, rtol=1e-6)
