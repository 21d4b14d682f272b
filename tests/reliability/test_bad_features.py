"""Bad feature values at the tensorcore lookup: each error names what is wrong.

Fills the gaps of tests/backends/test_tensorcore_validation.py (which covers
out-of-range ids of dense and ragged inputs, NaN/inf/negative ragged weights,
float ids, ragged rank 3, dense rank 3, weights of another kind or count, and
an empty dense batch): SparseTensor inputs, string/bool/NumPy/list ids, the
same checks inside a `tf.function` and on one replica of two, empty batches
in a training step, and a bad id reaching a real `Trainer`. Cases the backend
does not catch yet are `xfail(strict=True)`: they pass once it does.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402

import backends  # noqa: E402
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends.inputs import InvalidInputError  # noqa: E402
from tests.conftest import mirrored_strategy  # noqa: E402
from tests.training.few_steps import few_steps  # noqa: E402

E = tf.tpu.experimental.embedding
NAMED = r"feature 'f' \(table 'users', vocabulary_size=23\)"
NAMED_IN_GRAPH = r"feature `f` \(table `users`, vocabulary_size=23\)"


def make(combiner="sum", optimizer=None, strategy=None):
  table = E.TableConfig(23, 7, combiner=combiner, name="users")
  emb = backends.TensorCoreEmbedding(
    {"f": E.FeatureConfig(table)}, optimizer or E.SGD(0.1), strategy=strategy
  )
  if strategy is not None:
    with strategy.scope():
      emb.build()
  else:
    emb.build()
  return emb, table


def sparse(indices, values, shape, dtype=tf.int64):
  return tf.SparseTensor(
    tf.constant(indices, tf.int64), tf.constant(values, dtype), shape
  )


# -- ids -----------------------------------------------------------------------


def _assert_refused(ids, match):
  """Looking up `ids` of feature "f" raises InvalidInputError with `match`."""
  emb, _ = make()
  with pytest.raises(InvalidInputError, match=match):
    emb.lookup({"f": ids})


@pytest.mark.parametrize("bad_id,row", [(23, 1), (-4, 0), (2**40, 1)])
def test_sparse_out_of_range_id_names_feature_id_and_row(bad_id, row):
  emb, _ = make()
  values = [1, 2, 3]
  values[[0, 2][row]] = bad_id
  ids = sparse([[0, 0], [0, 1], [1, 0]], values, [2, 2])
  with pytest.raises(
    InvalidInputError,
    match=rf"{NAMED} got id {bad_id} at batch row {row}; ids must "
    r"be in \[0, 23\)",
  ):
    emb.lookup({"f": ids})


def test_sparse_out_of_range_id_inside_tf_function():
  emb, _ = make()
  step = tf.function(lambda f: emb.lookup(f))
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=rf"{NAMED_IN_GRAPH} got id 30 at batch row 1",
  ):
    step({"f": sparse([[0, 0], [1, 0], [1, 1]], [1, 2, 30], [2, 2])})


def test_out_of_range_id_on_one_of_two_replicas_names_feature_id_and_row():
  strategy = mirrored_strategy(2)
  emb, _ = make(strategy=strategy)
  per_replica = [tf.constant([1, 2], tf.int64), tf.constant([5, 99], tf.int64)]
  ids = strategy.experimental_distribute_values_from_function(
    lambda ctx: per_replica[ctx.replica_id_in_sync_group]
  )
  step = tf.function(
    lambda ids: strategy.run(lambda i: emb.lookup({"f": i})["f"], (ids,))
  )
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=rf"{NAMED_IN_GRAPH} got id 99 at batch row 1",
  ):
    step(ids)


@pytest.mark.parametrize("shape,rank", [([3], 1), ([2, 2, 1], 3)])
def test_sparse_of_wrong_rank(shape, rank):
  emb, _ = make()
  indices = [[0] * len(shape)]
  with pytest.raises(
    InvalidInputError,
    match=rf"{NAMED} got a SparseTensor of rank {rank}; expected "
    r"rank 2 \[batch, ids\]",
  ):
    emb.lookup({"f": sparse(indices, [1], shape)})


@pytest.mark.parametrize(
  "ids,dtype",
  [
    (tf.constant(["3", "4"]), "string"),
    (tf.constant([True, False]), "bool"),
    (tf.ragged.constant([[1.5], [2.0, 3.0]]), "float32"),
    (sparse([[0, 0]], [1.0], [1, 1], tf.float64), "float64"),
  ],
)
def test_ids_of_a_wrong_dtype(ids, dtype):
  _assert_refused(
    ids, rf"{NAMED} got ids of dtype {dtype}; expected int32 or int64 row ids"
  )


@pytest.mark.parametrize(
  "ids,kind", [(np.array([1, 2]), "ndarray"), ([1, 2], "list")]
)
def test_ids_that_are_not_tensors(ids, kind):
  _assert_refused(
    ids,
    rf"{NAMED} got a {kind}; expected a tf.Tensor, "
    "tf.SparseTensor or tf.RaggedTensor",
  )


def test_int32_and_uint8_ids_look_up_the_same_rows_as_int64():
  emb, table = make()
  values = emb.embedding_tables[table].numpy()
  for dtype in (tf.int32, tf.uint8):
    got = emb.lookup({"f": tf.constant([[3, 5]], dtype)})["f"].numpy()
    np.testing.assert_allclose(got[0], values[3] + values[5], rtol=1e-6)


# -- weights -------------------------------------------------------------------


@pytest.mark.parametrize("weight", [float("nan"), float("-inf"), -1.0])
def test_bad_sparse_weight_names_feature_and_value(weight):
  emb, _ = make()
  indices = [[0, 0], [1, 0], [1, 1]]
  with pytest.raises(
    InvalidInputError,
    match=rf"{NAMED} got weight {weight}; weights must be finite "
    "and >= 0",
  ):
    emb.lookup(
      {"f": sparse(indices, [1, 2, 3], [2, 2])},
      {"f": tf.SparseTensor(indices, [1.0, weight, 1.0], [2, 2])},
    )


def test_negative_weight_inside_tf_function():
  emb, _ = make()
  step = tf.function(lambda f, w: emb.lookup(f, w))
  ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
  with pytest.raises(
    tf.errors.InvalidArgumentError, match=rf"{NAMED_IN_GRAPH} got weight -0.5"
  ):
    step({"f": ids}, {"f": tf.ragged.constant([[1.0, -0.5], [1.0]])})


def test_sparse_weights_with_another_number_of_values():
  emb, _ = make()
  ids = sparse([[0, 0], [1, 0], [1, 1]], [1, 2, 3], [2, 2])
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=rf"{NAMED}: weights and ids have different numbers of values",
  ):
    emb.lookup({"f": ids}, {"f": tf.SparseTensor([[0, 0]], [1.0], [2, 2])})


def test_ragged_weights_with_other_row_lengths_are_refused():
  emb, _ = make()
  ids = tf.ragged.constant([[1], [2, 3]], tf.int64)  # rows of 1 and 2
  weights = tf.ragged.constant([[1.0, 1.0], [5.0]])  # rows of 2 and 1
  with pytest.raises(
    (InvalidInputError, tf.errors.InvalidArgumentError), match=r"'f'.*weights"
  ):
    emb.lookup({"f": ids}, {"f": weights})


def test_sparse_weights_at_other_positions_are_refused():
  emb, _ = make()
  ids = sparse([[0, 0], [1, 0], [1, 1]], [1, 2, 3], [2, 2])
  weights = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], [1.0, 1.0, 5.0], [2, 2])
  with pytest.raises(
    (InvalidInputError, tf.errors.InvalidArgumentError), match=r"'f'.*weights"
  ):
    emb.lookup({"f": ids}, {"f": weights})


@pytest.mark.parametrize("row", [5, -1])
def test_sparse_indices_outside_the_dense_shape_name_the_feature(row):
  emb, _ = make()
  with pytest.raises(InvalidInputError, match=rf"{NAMED}.*row"):
    emb.lookup({"f": sparse([[0, 0], [row, 0]], [1, 2], [2, 3])})


# -- empty batches -------------------------------------------------------------


def _train_step(emb, features, weights=None):
  with tf.GradientTape() as tape:
    acts = emb.lookup(features, weights, training=True)
    tape.watch(acts)
    loss = tf.add_n([tf.reduce_sum(a * a) + 1.0 for a in acts.values()])
  emb.apply_gradients(tape.gradient(loss, acts))
  return acts


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize(
  "ids",
  [
    tf.zeros([0], tf.int64),
    tf.ragged.constant([], tf.int64, ragged_rank=1),
    tf.SparseTensor(
      tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [0, 4]
    ),
    tf.ragged.constant([[], [], []], tf.int64),  # all bags empty
  ],
  ids=["dense_B0", "ragged_B0", "sparse_B0", "ragged_all_empty"],
)
def test_empty_batch_trains_nothing_and_returns_zeros(ids, graph):
  emb, table = make(combiner="mean", optimizer=E.Adagrad(0.1))
  before = emb.embedding_tables[table].numpy()
  slots = emb.slot_variables()["users"]["accumulators"].numpy()
  step = (
    tf.function(functools.partial(_train_step, emb))
    if graph
    else (functools.partial(_train_step, emb))
  )
  acts = step({"f": ids})
  batch = ids.shape[0] if not isinstance(ids, tf.SparseTensor) else 0
  np.testing.assert_array_equal(acts["f"].numpy(), np.zeros((batch, 7)))
  np.testing.assert_array_equal(emb.embedding_tables[table].numpy(), before)
  np.testing.assert_array_equal(
    emb.slot_variables()["users"]["accumulators"].numpy(), slots
  )


def test_empty_batch_on_one_of_two_replicas():
  """The replica with data trains; the empty one joins the exchange, no ids."""
  strategy = mirrored_strategy(2)
  emb, table = make(optimizer=E.SGD(0.5), strategy=strategy)
  before = emb.embedding_tables[table].numpy()
  per_replica = [tf.zeros([0], tf.int64), tf.constant([4, 4, 9], tf.int64)]
  ids = strategy.experimental_distribute_values_from_function(
    lambda ctx: per_replica[ctx.replica_id_in_sync_group]
  )

  @tf.function
  def step(ids):
    def replica_step(i):
      with tf.GradientTape() as tape:
        acts = emb.lookup({"f": i}, training=True)
        tape.watch(acts)
        loss = tf.reduce_sum(acts["f"])
      emb.apply_gradients(tape.gradient(loss, acts))

    strategy.run(replica_step, (ids,))

  step(ids)
  want = before.copy()
  want[4] -= 0.5 * 2  # d loss / d row = 1 per occurrence, summed: 2
  want[9] -= 0.5
  np.testing.assert_allclose(
    emb.embedding_tables[table].numpy(), want, rtol=1e-6
  )


# -- through the trainer -------------------------------------------------------


def test_source_with_ids_beyond_its_declared_vocabulary_stops_training(
  tmp_path,
):
  """A data source whose ids exceed its FeatureSpec fails naming the feature."""
  from recsys.feature_spec import FeatureSpec  # pylint: disable=g-import-not-at-top
  from recsys.features import EmbeddingSettings  # pylint: disable=g-import-not-at-top
  from recsys.models import DLRM  # pylint: disable=g-import-not-at-top
  from recsys.training import Trainer  # pylint: disable=g-import-not-at-top
  from tests.training.sources import ArraySource  # pylint: disable=g-import-not-at-top

  source = ArraySource(vocab=23)
  source.feature_specs = [FeatureSpec("user", 11), source.feature_specs[1]]
  trainer = Trainer(
    str(tmp_path),
    source,
    functools.partial(DLRM, bottom_mlp=(11, 7), top_mlp=(11,)),
    embedding=EmbeddingSettings(dim=7),
    embedding_optimizer=E.SGD(0.1),
    **few_steps(),
  )
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"feature `user` \(table `user`, vocabulary_size=11\) got "
    r"id \d+ at batch row \d+; ids must be in \[0, 11\)",
  ):
    trainer.train()
