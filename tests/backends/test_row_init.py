"""Row-keyed initial values (`backends.storage.row_init`) against their
references.

References: TF's own initializers for the distribution (moments and range
over 10^5 x 8 draws), NumPy for the variance-scaling arithmetic, and the
1-replica replicated table for the values every placement, layout and
replica count must start from.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from backends.layout import TableLayout
from backends.storage import row_init
from backends.tensorcore.backend import TensorCoreEmbedding
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
K = tf.keras.initializers
V, D = 100_000, 8


@pytest.mark.parametrize(
  "initializer",
  [
    None,  # TableConfig's default: TruncatedNormal(0, 1/sqrt(dim))
    K.RandomUniform(-0.5, 1.5, seed=3),
    K.RandomNormal(1.0, 2.0, seed=4),
    tf.initializers.TruncatedNormal(0.2, 0.5, seed=2),
    tf.compat.v1.truncated_normal_initializer(0.0, 0.3, seed=5),
    K.GlorotUniform(seed=1),
    K.HeNormal(seed=1),
    K.VarianceScaling(2.0, "fan_out", "untruncated_normal", seed=6),
    K.Constant(0.25),
    K.Zeros(),
  ],
  ids=lambda i: type(i).__name__,
)
def test_distribution_matches_the_initializers(initializer):
  table = E.TableConfig(V, D, name="t", initializer=initializer)
  rows = row_init.RowInitializer.for_table(table)
  assert rows is not None
  got = rows.rows(tf.range(V, dtype=tf.int64)).numpy()
  want = table.initializer((V, D), dtype=tf.float32).numpy()
  assert got.shape == (V, D) and got.dtype == np.float32
  scale = max(float(want.std()), 1e-3)
  assert abs(got.mean() - want.mean()) < 0.02 * scale + 1e-7
  assert abs(got.std() - want.std()) < 0.02 * scale
  if rows.distribution != "normal":
    # Bounded distributions: the same range, reached.
    assert got.min() >= want.min() - 0.01 * scale
    assert got.max() <= want.max() + 0.01 * scale
    assert got.max() - got.min() >= 0.98 * (want.max() - want.min())


def test_variance_scaling_arithmetic():
  """Glorot uniform on [V, D]: limit sqrt(6 / (V + D)) (NumPy's formula)."""
  rows = row_init.from_initializer(K.GlorotUniform(seed=1), (V, D), 0)
  limit = math.sqrt(6.0 / (V + D))
  assert rows.distribution == "uniform"
  assert rows.a == pytest.approx(-limit) and rows.b == pytest.approx(limit)


def test_a_row_is_its_own_whatever_is_asked_with_it():
  rows = row_init.RowInitializer.for_table(E.TableConfig(50, 5, name="t"))
  whole = rows.rows(tf.range(50, dtype=tf.int64)).numpy()
  picked = [49, 3, 3, 0, 17]
  # Exact in any call size: correctly rounded ops only (exact_math).
  np.testing.assert_array_equal(rows.rows(picked).numpy(), whole[picked])
  # Distinct rows and columns differ; another seed gives other values.
  assert len(np.unique(whole)) == whole.size
  other = row_init.RowInitializer.for_table(
    E.TableConfig(50, 5, name="t", initializer=K.TruncatedNormal(seed=9))
  )
  assert not np.allclose(other.rows(picked).numpy(), whole[picked])


def test_unknown_initializers_have_no_row_form():
  for init in (
    lambda shape, dtype=None: tf.ones(shape),
    K.Orthogonal(),
    K.Identity(),
    K.Constant(np.ones((3, 5))),
  ):
    table = E.TableConfig(3, 5, name="t", initializer=init)
    assert row_init.RowInitializer.for_table(table) is None


def test_an_unseeded_initializer_is_keyed_by_the_table_name():
  a = row_init.RowInitializer.for_table(E.TableConfig(9, 4, name="a"))
  again = row_init.RowInitializer.for_table(E.TableConfig(9, 4, name="a"))
  b = row_init.RowInitializer.for_table(E.TableConfig(9, 4, name="b"))
  ids = tf.range(9, dtype=tf.int64)
  np.testing.assert_array_equal(a.rows(ids), again.rows(ids))
  assert not np.allclose(a.rows(ids), b.rows(ids))


def test_fill_in_chunks_equals_one_draw(monkeypatch):
  monkeypatch.setattr(row_init, "DRAW_BYTES", 3 * 4 * 4)  # 4 rows of 3
  rows = row_init.RowInitializer.for_table(E.TableConfig(11, 3, name="t"))
  assert rows.chunk_rows() == 4
  variable = tf.Variable(tf.zeros([6, 3]))
  rows.fill(variable, range(1, 11, 2))  # rows 1, 3, ..., 9
  want = rows.rows(tf.range(1, 11, 2, dtype=tf.int64)).numpy()
  # Exact in any chunk size: correctly rounded ops only (exact_math).
  np.testing.assert_array_equal(variable.numpy()[:5], want)
  np.testing.assert_array_equal(variable.numpy()[5], np.zeros(3))


def _initial_table(replicas, placement, layout="contiguous"):
  strategy = (
    mirrored_strategy(replicas)
    if replicas > 1
    else tf.distribute.get_strategy()
  )
  table = E.TableConfig(
    37, 6, name="t", initializer=K.TruncatedNormal(0.0, 0.4, seed=11)
  )
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)},
      E.Adam(0.1),
      strategy,
      layouts=TableLayout(placement, row_layout=layout),
    )
    emb.build()
  return tf.convert_to_tensor(emb.embedding_tables[emb.tables[0]]).numpy()


@pytest.mark.parametrize(
  "replicas,placement,layout",
  [
    (2, "row_sharded", "contiguous"),
    (4, "row_sharded", "strided"),
    (4, "row_sharded", "contiguous"),
    (2, "replicated", "contiguous"),
  ],
)
def test_every_placement_starts_from_the_same_rows(replicas, placement, layout):
  """A row's first value depends on its id alone (37 rows: uneven shards)."""
  want = _initial_table(1, "replicated")
  got = _initial_table(replicas, placement, layout)
  # Exact on any CPU: correctly rounded ops only (exact_math), issue 52.
  np.testing.assert_array_equal(got, want)
