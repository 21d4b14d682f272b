"""The TensorCore fast path (issue 6) against NumPy references.

Covers what the speed work added: padded bags without weights (the marker
`pad_bags` leaves), SparseTensor bags out of canonical order (unsorted
segments), weighted and unweighted features sharing one table, the update
reusing the lookup's rows on one replica, and several tables' updates run
as one (`optimizers.apply_sparse_updates`).
"""

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import backends  # noqa: E402
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import conformance, optimizers  # noqa: E402
from backends import reference_optimizers as ref  # noqa: E402
from tests.backends import optimizer_cases  # noqa: E402

E = tf.tpu.experimental.embedding
VOCAB, DIM, BATCH = 23, 7, 5


def _bags(rng, max_len=4):
  rows = [
    list(rng.integers(0, VOCAB, size=rng.integers(0, max_len + 1)))
    for _ in range(BATCH)
  ]
  rows[1] = [3, 3, 4]  # repeated ids in a bag
  return rows


def _expected_acts(table, rows, weights=None):
  out = np.zeros((len(rows), table.shape[1]))
  for b, ids in enumerate(rows):
    for k, i in enumerate(ids):
      out[b] += (weights[b][k] if weights else 1.0) * table[i]
  return out


def _expected_row_grads(
  rows_per_feature, grads_per_feature, weights_per_feature
):
  """Each touched row's gradient summed over every occurrence (NumPy)."""
  summed = {}
  for rows, grads, weights in zip(
    rows_per_feature, grads_per_feature, weights_per_feature
  ):
    for b, ids in enumerate(rows):
      for k, i in enumerate(ids):
        w = weights[b][k] if weights else 1.0
        summed[i] = summed.get(i, 0.0) + w * grads[b]
  ids = np.array(sorted(summed), np.int64)
  return ids, np.stack([summed[i] for i in ids]) if len(ids) else np.zeros(
    (0, DIM)
  )


@pytest.mark.parametrize("in_function", [False, True])
def test_padded_unweighted_bags_train_like_numpy(in_function):
  rng = np.random.default_rng(0)
  table = E.TableConfig(VOCAB, DIM, combiner="sum", name="t")
  config = {"a": E.FeatureConfig(table), "b": E.FeatureConfig(table)}
  opt = E.Adagrad(0.1)
  emb = backends.TensorCoreEmbedding(config, opt, bag_widths=4)
  emb.build()
  table0 = emb.embedding_tables[table].numpy()
  rows = {"a": _bags(rng), "b": _bags(rng, max_len=3)}
  ragged = {
    k: tf.ragged.constant(v, dtype=tf.int64, ragged_rank=1)
    for k, v in rows.items()
  }
  padded, no_weights = emb.preprocess(ragged)
  assert no_weights is None
  assert padded["a"].weights.shape[1] == 0  # the "no weights" marker
  coefficients = {
    k: tf.constant(rng.normal(size=(BATCH, DIM)), tf.float32) for k in rows
  }
  step = (
    tf.function(conformance.linear_loss_step)
    if in_function
    else conformance.linear_loss_step
  )
  acts = step(emb, padded, None, coefficients)

  for k in rows:
    np.testing.assert_allclose(
      acts[k], _expected_acts(table0, rows[k]), rtol=1e-5, atol=1e-6
    )
  ids, grads = _expected_row_grads(
    [rows["a"], rows["b"]],
    [coefficients["a"].numpy(), coefficients["b"].numpy()],
    [None, None],
  )
  want_table, want_slots = ref.apply(
    opt, table0, ref.initial_slots(opt, VOCAB, DIM), ids, grads
  )
  np.testing.assert_allclose(
    emb.embedding_tables[table], want_table, rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    emb.slot_variables()["t"]["accumulators"],
    want_slots["accumulators"],
    rtol=1e-5,
    atol=1e-6,
  )


def test_weighted_and_unweighted_features_share_a_table():
  rng = np.random.default_rng(1)
  table = E.TableConfig(VOCAB, DIM, combiner="sum", name="t")
  config = {"w": E.FeatureConfig(table), "u": E.FeatureConfig(table)}
  opt = E.SGD(0.5)
  emb = backends.TensorCoreEmbedding(config, opt)
  emb.build()
  table0 = emb.embedding_tables[table].numpy()
  rows = {"w": _bags(rng), "u": _bags(rng)}
  wts = [list(rng.uniform(0.2, 2.0, len(r))) for r in rows["w"]]
  features = {
    k: tf.ragged.constant(v, dtype=tf.int64, ragged_rank=1)
    for k, v in rows.items()
  }
  weights = {
    "w": tf.ragged.constant(wts, dtype=tf.float32, ragged_rank=1),
    "u": None,
  }
  coefficients = {
    k: tf.constant(rng.normal(size=(BATCH, DIM)), tf.float32) for k in rows
  }
  acts = conformance.linear_loss_step(emb, features, weights, coefficients)

  np.testing.assert_allclose(
    acts["w"], _expected_acts(table0, rows["w"], wts), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    acts["u"], _expected_acts(table0, rows["u"]), rtol=1e-5, atol=1e-6
  )
  ids, grads = _expected_row_grads(
    [rows["w"], rows["u"]],
    [coefficients["w"].numpy(), coefficients["u"].numpy()],
    [wts, None],
  )
  want, _ = ref.apply(opt, table0, {}, ids, grads)
  np.testing.assert_allclose(
    emb.embedding_tables[table], want, rtol=1e-5, atol=1e-6
  )


def test_sparse_tensor_out_of_canonical_order():
  """Indices not sorted by row: the unsorted segment reduction is used."""
  rng = np.random.default_rng(2)
  table = E.TableConfig(VOCAB, DIM, combiner="sum", name="t")
  opt = E.Adagrad(0.2)
  emb = backends.TensorCoreEmbedding({"f": E.FeatureConfig(table)}, opt)
  emb.build()
  table0 = emb.embedding_tables[table].numpy()
  rows = [[4, 9], [1], [], [4, 7, 7], [0]]
  entries = [(b, k, i) for b, ids in enumerate(rows) for k, i in enumerate(ids)]
  order = rng.permutation(len(entries))
  sparse = tf.SparseTensor(
    indices=[[entries[j][0], entries[j][1]] for j in order],
    values=tf.constant([entries[j][2] for j in order], tf.int64),
    dense_shape=[BATCH, 3],
  )
  coefficients = {"f": tf.constant(rng.normal(size=(BATCH, DIM)), tf.float32)}
  acts = conformance.linear_loss_step(emb, {"f": sparse}, None, coefficients)

  np.testing.assert_allclose(
    acts["f"], _expected_acts(table0, rows), rtol=1e-5, atol=1e-6
  )
  ids, grads = _expected_row_grads([rows], [coefficients["f"].numpy()], [None])
  want, _ = ref.apply(
    opt, table0, ref.initial_slots(opt, VOCAB, DIM), ids, grads
  )
  np.testing.assert_allclose(
    emb.embedding_tables[table], want, rtol=1e-5, atol=1e-6
  )


def _optimizers():
  return {
    "sgd": E.SGD(0.1),
    "adagrad_options": optimizer_cases.adagrad_with_options(),
    "adagrad_momentum": E.AdagradMomentum(0.1, momentum=0.9, beta2=0.9),
    "adam_lazy": E.Adam(0.05),
    "adam_dense": E.Adam(0.05, lazy_adam=False),
    "ftrl": E.FTRL(0.1, l1_regularization_strength=0.01, beta=0.1),
  }


@pytest.mark.parametrize("name", sorted(_optimizers()))
@pytest.mark.parametrize("dims", [(7, 7, 7), (7, 11, 7)])
def test_grouped_update_matches_reference(name, dims):
  """apply_sparse_updates == the NumPy update of each table on its own."""
  opt = _optimizers()[name]
  rng = np.random.default_rng(3)
  updates, expected = [], []
  for k, dim in enumerate(dims):
    vocab = VOCAB + 2 * k
    table0 = rng.normal(size=(vocab, dim)).astype(np.float32)
    slots0 = ref.initial_slots(opt, vocab, dim)
    ids = rng.choice(vocab, size=5 + k, replace=False).astype(np.int64)
    grads = rng.normal(size=(len(ids), dim)).astype(np.float32)
    table = tf.Variable(table0)
    slots = {n: tf.Variable(v) for n, v in slots0.items()}
    # Every other table passes its current rows, as the one-replica lookup does.
    rows = tf.constant(table0[ids]) if k % 2 == 0 else None
    updates.append(
      optimizers.SparseUpdate(
        table, slots, tf.constant(ids), tf.constant(grads), rows
      )
    )
    expected.append((table, slots, ref.apply(opt, table0, slots0, ids, grads)))
  tf.function(lambda: optimizers.apply_sparse_updates(opt, updates))()
  for table, slots, (want_table, want_slots) in expected:
    np.testing.assert_allclose(table, want_table, rtol=1e-5, atol=1e-6)
    for n, v in slots.items():
      np.testing.assert_allclose(v, want_slots[n], rtol=1e-5, atol=1e-6)
