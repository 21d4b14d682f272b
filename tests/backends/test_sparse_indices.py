"""SparseTensors as producers make them: unordered, gapped, bad columns.

TF's sparse ops assume row-major order and columns inside `dense_shape`;
producers do not always give either. Each case here is a NumPy-equal result
or an error naming the feature, through `preprocess` (the trainer's path) and
straight into `lookup`.
"""

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import inputs  # noqa: E402
from backends.tensorcore.backend import TensorCoreEmbedding  # noqa: E402

E = tf.tpu.experimental.embedding
V, D = 23, 7
TABLE = np.random.default_rng(0).normal(size=(V, D)).astype(np.float32)


def _emb(seq_len=0, bag_width=2, static=False, combiner="sum"):
  table = E.TableConfig(
    V,
    D,
    name="t",
    combiner=combiner,
    initializer=tf.constant_initializer(TABLE),
  )
  feature = E.FeatureConfig(table, max_sequence_length=seq_len)
  return TensorCoreEmbedding(
    {"f": feature},
    E.SGD(0.1),
    bag_widths=None if seq_len else bag_width,
    static_shapes=static,
  )


def _sparse(indices, values, shape):
  return tf.SparseTensor(
    tf.constant(indices, tf.int64), tf.constant(values, tf.int64), shape
  )


PATHS = ["preprocess", "lookup", "static lookup"]


def _run(emb, sp, path):
  features = {"f": sp}
  if path == "preprocess":
    features, _ = emb.preprocess(features)
  return emb.lookup(features, training=True)["f"].numpy()


@pytest.mark.parametrize("path", PATHS)
def test_unordered_indices_keep_each_id_in_its_row(path):
  emb = _emb(static=path == "static lookup")
  sp = _sparse(
    [[1, 0], [0, 0], [1, 1], [0, 1], [0, 2]], [4, 3, 9, 5, 8], [2, 3]
  )
  got = _run(emb, sp, path)
  # Row 0 holds 3 (col 0), 5 (col 1), 8 (col 2, cut at width 2); row 1: 4, 9.
  np.testing.assert_allclose(
    got, [TABLE[3] + TABLE[5], TABLE[4] + TABLE[9]], rtol=1e-6
  )
  if path != "static lookup":
    assert emb.input_stats()["truncated_ids"]["f"] == 1


@pytest.mark.parametrize("path", PATHS)
def test_a_gap_in_a_bag_is_not_an_id(path):
  emb = _emb(static=path == "static lookup")
  sp = _sparse([[0, 5], [1, 1], [1, 4], [1, 9]], [6, 2, 7, 11], [2, 10])
  got = _run(emb, sp, path)
  np.testing.assert_allclose(got, [TABLE[6], TABLE[2] + TABLE[7]], rtol=1e-6)
  if path != "static lookup":
    assert emb.input_stats()["truncated_ids"]["f"] == 1  # only id 11


@pytest.mark.parametrize("path", PATHS)
def test_a_negative_column_is_refused_naming_the_feature(path):
  emb = _emb(seq_len=3, static=path == "static lookup")
  sp = _sparse([[0, 0], [1, -1]], [4, 5], [2, 3])
  with pytest.raises(
    inputs.InvalidInputError, match="feature 'f'.*negative column"
  ):
    _run(emb, sp, path)


def test_a_sequence_with_a_gap_is_refused_by_preprocess_naming_the_row():
  emb = _emb(seq_len=3)
  sp = _sparse([[0, 0], [1, 0], [1, 2]], [4, 5, 6], [2, 3])
  with pytest.raises(
    inputs.InvalidInputError,
    match="feature 'f'.*row 1 has an id at column 2 where position 1",
  ):
    emb.preprocess({"f": sp})


def test_a_sequence_gap_looked_up_directly_is_a_zero_row():
  emb = _emb(seq_len=3)
  sp = _sparse([[1, 2], [0, 0], [1, 0], [1, 7]], [6, 4, 5, 9], [2, 8])
  got = emb.lookup({"f": sp}, training=True)["f"].numpy()
  want = np.zeros((2, 3, D), np.float32)
  want[0, 0], want[1, 0], want[1, 2] = TABLE[4], TABLE[5], TABLE[6]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert emb.input_stats()["truncated_ids"]["f"] == 1  # column 7 >= 3


def test_an_unordered_sequence_is_padded_in_position_order():
  emb = _emb(seq_len=3)
  sp = _sparse(
    [[1, 1], [0, 0], [1, 0], [1, 4], [1, 2]], [6, 4, 5, 9, 2], [2, 5]
  )
  padded, _ = emb.preprocess({"f": sp})
  got = emb.lookup(padded, training=True)["f"].numpy()
  want = np.zeros((2, 3, D), np.float32)
  want[0, 0], want[1, 0], want[1, 1] = TABLE[4], TABLE[5], TABLE[6]
  want[1, 2] = TABLE[2]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert emb.input_stats()["truncated_ids"]["f"] == 1  # column 4
  gapped = _sparse([[0, 0], [0, 1], [0, 4]], [4, 5, 6], [1, 5])
  with pytest.raises(
    inputs.InvalidInputError, match="column 4 where position 2"
  ):
    emb.preprocess({"f": gapped})


def test_unordered_weights_stay_on_their_ids_in_a_tf_data_pipeline():
  emb = _emb(combiner="mean", bag_width=3)
  sp = _sparse([[1, 0], [0, 1], [0, 0]], [4, 3, 8], [2, 2])
  w = tf.SparseTensor(sp.indices, tf.constant([1.0, 3.0, 1.0]), sp.dense_shape)
  ds = tf.data.Dataset.from_tensors(({"f": sp}, {"f": w})).map(emb.preprocess)
  features, weights = next(iter(ds))
  got = emb.lookup(features, weights, training=True)["f"].numpy()
  np.testing.assert_allclose(
    got, [(TABLE[8] + 3 * TABLE[3]) / 4, TABLE[4]], rtol=1e-6
  )


def test_a_compiled_lookup_reorders_with_static_shapes():
  """The XLA path (a TPU's) sorts only when needed, with no dynamic shape."""
  emb = _emb(combiner="mean", static=None)  # None: static path when compiled
  emb.build()
  sp = _sparse(
    [[1, 0], [0, 5], [1, 1], [0, 1], [0, 2]], [4, 3, 9, 5, 8], [2, 6]
  )

  @tf.function(jit_compile=True)
  def lookup(indices, values):
    return emb.lookup({"f": tf.SparseTensor(indices, values, [2, 6])})["f"]

  got = lookup(sp.indices, sp.values).numpy()
  np.testing.assert_allclose(
    got, [(TABLE[5] + TABLE[8]) / 2, (TABLE[4] + TABLE[9]) / 2], rtol=1e-6
  )
  hlo = lookup.experimental_get_compiler_ir(sp.indices, sp.values)(stage="hlo")
  assert "<=" not in hlo


@pytest.mark.parametrize(
  "indices",
  [[[0, 0], [5, 0]], [[0, 0], [1, -1]]],
  ids=["row outside", "negative column"],
)
def test_bad_indices_in_a_tf_data_pipeline_name_the_feature(indices):
  """Graph mode: the check runs before the ops that would fail anonymously."""
  emb = _emb(seq_len=3)
  sp = _sparse(indices, [4, 5], [2, 3])
  ds = tf.data.Dataset.from_tensors({"f": sp}).map(
    lambda f: emb.preprocess(f)[0]
  )
  with pytest.raises(tf.errors.InvalidArgumentError, match="feature `f`"):
    next(iter(ds))
