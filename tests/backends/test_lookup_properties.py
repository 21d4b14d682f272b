"""Property tests of the tensorcore lookup and one training step against NumPy.

Hypothesis draws vocabulary sizes, dims, batch sizes (0 and 1 included),
bags (empty bags, all-empty batches, ids repeated within and across bags),
per-id weights (zeros included), combiners and input kinds (dense `[B, N]`,
`tf.SparseTensor`, `tf.RaggedTensor`), and checks:

* the lookup equals a NumPy bag combiner (TF's semantics: `sum` = sum of
  weight x row, `mean` / `sqrtn` divided by the sum of the weights / the root
  of the sum of their squares, 0 for a bag whose divisor is 0), eagerly and
  inside a `tf.function`;
* a sequence feature gives `[B, L, D]`: rows padded with zeros or cut at L;
* one `apply_gradients` step with SGD or Adagrad, two features sharing the
  table, changes exactly the touched rows as `backends/reference_optimizers.py`
  says, with each row's gradient summed over every occurrence.

Backends are cached per shape family (vocab, dim, combiner, optimizer): eager
lookups need no tracing, so each example costs a few milliseconds.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import backends  # noqa: E402
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import reference_optimizers as ref  # noqa: E402

E = tf.tpu.experimental.embedding

SETTINGS = settings(
  max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
COMBINERS = ("sum", "mean", "sqrtn")
KINDS = ("ragged", "sparse", "dense")


# -- the NumPy reference -------------------------------------------------------


def bag_norm(ws, combiner: str) -> float:
  """The combiner's normaliser of one bag's weights (1 for sum)."""
  if combiner == "mean":
    return sum(ws)
  if combiner == "sqrtn":
    return np.sqrt(sum(w * w for w in ws))
  return 1.0


def combine(table: np.ndarray, bags, weights, combiner: str) -> np.ndarray:
  """`[B, D]`: each bag's rows combined as TF's embedding_lookup_sparse does."""
  out = np.zeros((len(bags), table.shape[1]), np.float64)
  for b, (ids, ws) in enumerate(zip(bags, weights)):
    for i, w in zip(ids, ws):
      out[b] += w * table[i]
    norm = bag_norm(ws, combiner)
    out[b] = out[b] / norm if norm else 0.0
  return out


def row_gradients(bags, weights, combiner: str, act_grads: np.ndarray):
  """Per-occurrence (id, d loss / d row) of one feature, for `ref.sum_duplicates`."""
  ids, grads = [], []
  for b, (bag, ws) in enumerate(zip(bags, weights)):
    norm = bag_norm(ws, combiner)
    for i, w in zip(bag, ws):
      ids.append(i)
      grads.append((w / norm if norm else 0.0) * act_grads[b])
  return ids, grads


# -- inputs --------------------------------------------------------------------


def to_input(kind: str, bags, weights, weighted: bool):
  """(ids, weights or None) as the input kind holds them."""
  if kind == "dense":
    width = len(bags[0]) if bags else 0
    return tf.constant(np.array(bags, np.int64).reshape(len(bags), width)), None
  lengths = [len(b) for b in bags]
  flat_ids = np.array([i for b in bags for i in b], np.int64)
  flat_w = np.array([w for ws in weights for w in ws], np.float32)
  ragged = tf.RaggedTensor.from_row_lengths(
    flat_ids, np.array(lengths, np.int64)
  )
  ragged_w = tf.RaggedTensor.from_row_lengths(
    flat_w, np.array(lengths, np.int64)
  )
  if kind == "ragged":
    return ragged, (ragged_w if weighted else None)
  width = max(lengths, default=0)
  indices = np.array(
    [[b, p] for b, n in enumerate(lengths) for p in range(n)], np.int64
  ).reshape(-1, 2)
  shape = [len(bags), width]
  return (
    tf.SparseTensor(indices, flat_ids, shape),
    tf.SparseTensor(indices, flat_w, shape) if weighted else None,
  )


@st.composite
def features(draw, vocab: int, kind: str, batch=None, max_len: int = 5):
  """(bags, weights, weighted) for one feature of `kind`."""
  batch = draw(st.integers(0, 6)) if batch is None else batch
  id_ = st.integers(0, vocab - 1)
  if kind == "dense":
    width = draw(st.integers(0, max_len))
    bags = [
      draw(st.lists(id_, min_size=width, max_size=width)) for _ in range(batch)
    ]
    return bags, [[1.0] * width for _ in bags], False
  bags = [draw(st.lists(id_, max_size=max_len)) for _ in range(batch)]
  weighted = draw(st.booleans())
  weight = st.one_of(st.just(0.0), st.floats(0.0625, 4.0, width=32))
  weights = (
    [[draw(weight) for _ in b] for b in bags]
    if weighted
    else [[1.0] * len(b) for b in bags]
  )
  return bags, weights, weighted


# -- backends, cached per shape family -----------------------------------------


@functools.cache
def lookup_backend(vocab: int, dim: int, combiner: str, seq_len: int = 0):
  table = E.TableConfig(vocab, dim, combiner=combiner, name="t")
  emb = backends.create(
    {"f": E.FeatureConfig(table, max_sequence_length=seq_len)},
    E.SGD(0.1),
    backend="tensorcore",
  )
  emb.build()
  return emb, table


@functools.cache
def training_backend(vocab: int, dim: int, combiner: str, optimizer: str):
  opt = {"sgd": E.SGD(0.1), "adagrad": E.Adagrad(0.1)}[optimizer]
  table = E.TableConfig(vocab, dim, combiner=combiner, name="t")
  emb = backends.create(
    {"f": E.FeatureConfig(table), "g": E.FeatureConfig(table)},
    opt,
    backend="tensorcore",
  )
  emb.build()
  return emb, table, opt


@functools.cache
def graph_lookup(combiner: str):
  emb, table = lookup_backend(23, 7, combiner)
  return (
    tf.function(lambda f, w: emb.lookup(f, w), reduce_retracing=True),
    emb,
    table,
  )


def table_values(emb, table) -> np.ndarray:
  return emb.embedding_tables[table].numpy().astype(np.float64)


# -- properties ----------------------------------------------------------------


@st.composite
def lookup_cases(draw):
  vocab = draw(st.integers(1, 40))
  kind = draw(st.sampled_from(KINDS))
  return (
    vocab,
    draw(st.integers(1, 12)),
    draw(st.sampled_from(COMBINERS)),
    kind,
    draw(features(vocab, kind)),
  )


@SETTINGS
@given(lookup_cases())
@example((23, 7, "mean", "ragged", ([], [], False)))  # empty batch
@example((23, 7, "sqrtn", "sparse", ([[]], [[]], True)))  # batch 1, empty bag
@example(
  (23, 7, "mean", "ragged", ([[], [], []], [[], [], []], False))
)  # all bags empty
@example(
  (5, 11, "sum", "ragged", ([[3, 3, 3], [3]], [[1.0, 2.0, 0.5], [4.0]], True))
)
@example(
  (5, 7, "mean", "sparse", ([[1, 2], [4]], [[0.0, 0.0], [0.0]], True))
)  # zero weights
@example(
  (1, 1, "sum", "dense", ([[0, 0]], [[1.0, 1.0]], False))
)  # vocab 1, dim 1
@example((23, 7, "sum", "dense", ([[], []], [[], []], False)))  # dense [B, 0]
def test_lookup_matches_numpy(case):
  vocab, dim, combiner, kind, (bags, weights, weighted) = case
  emb, table = lookup_backend(vocab, dim, combiner)
  ids, w = to_input(kind, bags, weights, weighted)
  got = emb.lookup({"f": ids}, {"f": w} if w is not None else None)["f"]
  want = combine(table_values(emb, table), bags, weights, combiner)
  assert got.shape == (len(bags), dim)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(
  st.sampled_from(COMBINERS),
  st.sampled_from(("ragged", "sparse")),
  features(23, "ragged"),
)
def test_lookup_inside_tf_function_matches_numpy(combiner, kind, feature):
  bags, weights, weighted = feature
  step, emb, table = graph_lookup(combiner)
  ids, w = to_input(kind, bags, weights, True)  # weights always: one signature
  got = step({"f": ids}, {"f": w})["f"]
  want = combine(table_values(emb, table), bags, weights, combiner)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(
  st.integers(1, 30),
  st.integers(1, 9),
  st.integers(1, 4),
  st.sampled_from(("ragged", "sparse")),
  st.data(),
)
def test_sequence_feature_pads_and_cuts_at_its_length(
  vocab, dim, seq_len, kind, data
):
  bags, weights, _ = data.draw(features(vocab, "ragged", max_len=6))
  emb, table = lookup_backend(vocab, dim, "sum", seq_len)
  ids, _ = to_input(kind, bags, weights, False)
  got = emb.lookup({"f": ids})["f"].numpy()
  values = table_values(emb, table)
  want = np.zeros((len(bags), seq_len, dim))
  for b, bag in enumerate(bags):
    for p, i in enumerate(bag[:seq_len]):
      want[b, p] = values[i]
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@st.composite
def training_cases(draw):
  vocab = draw(st.integers(1, 30))
  dim = draw(st.integers(1, 9))
  batch = draw(st.integers(0, 5))
  kind = draw(st.sampled_from(KINDS))
  f = draw(features(vocab, kind, batch=batch))
  g = draw(features(vocab, "dense", batch=batch, max_len=2))
  grads = draw(
    st.lists(
      st.floats(-2.0, 2.0, width=32),
      min_size=2 * batch * dim,
      max_size=2 * batch * dim,
    )
  )
  return (
    vocab,
    dim,
    draw(st.sampled_from(COMBINERS)),
    draw(st.sampled_from(("sgd", "adagrad"))),
    kind,
    f,
    g,
    np.array(grads, np.float64).reshape(2, batch, dim),
  )


@SETTINGS
@given(training_cases())
@example(
  (
    7,
    3,
    "mean",
    "adagrad",
    "ragged",
    ([[], [2, 2]], [[], [1.0, 3.0]], True),
    ([[2], [2]], [[1.0], [1.0]], False),
    np.ones((2, 2, 3)),
  )
)  # one row, 4 times
@example(
  (
    7,
    3,
    "sum",
    "sgd",
    "sparse",
    ([], [], True),
    ([], [], False),
    np.zeros((2, 0, 3)),
  )
)  # empty batch
def test_one_training_step_matches_reference_optimizer(case):
  vocab, dim, combiner, opt_name, kind, f, g, act_grads = case
  emb, table, opt = training_backend(vocab, dim, combiner, opt_name)
  before = table_values(emb, table)
  slots = {
    k: v.numpy().astype(np.float64)
    for k, v in emb.slot_variables()["t"].items()
  }
  f_ids, f_w = to_input(kind, f[0], f[1], f[2])
  g_ids, _ = to_input("dense", g[0], g[1], False)
  acts = emb.lookup(
    {"f": f_ids, "g": g_ids},
    {"f": f_w, "g": None} if f_w is not None else None,
    training=True,
  )
  emb.apply_gradients(
    {
      "f": tf.constant(act_grads[0], tf.float32),
      "g": tf.constant(act_grads[1], tf.float32),
    }
  )

  np.testing.assert_allclose(
    acts["f"].numpy(),
    combine(before, f[0], f[1], combiner),
    rtol=1e-5,
    atol=1e-6,
  )
  ids_f, grads_f = row_gradients(f[0], f[1], combiner, act_grads[0])
  ids_g, grads_g = row_gradients(g[0], g[1], combiner, act_grads[1])
  ids = np.array(ids_f + ids_g, np.int64)
  want_table, want_slots = before, slots
  if ids.size:
    unique, summed = ref.sum_duplicates(
      ids, np.array(grads_f + grads_g).reshape(-1, dim)
    )
    want_table, want_slots = ref.apply(opt, before, slots, unique, summed)
  np.testing.assert_allclose(
    table_values(emb, table), want_table, rtol=1e-5, atol=1e-6
  )
  for name, value in want_slots.items():
    np.testing.assert_allclose(
      emb.slot_variables()["t"][name].numpy(),
      value,
      rtol=1e-5,
      atol=1e-6,
      err_msg=name,
    )


if __name__ == "__main__":
  pytest.main([__file__, "-q"])
