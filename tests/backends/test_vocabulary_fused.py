"""`VocabularyIndex.update` on the fused op (`RecsysVocabularyUpdate`,
backends/tensorcore/kernels/vocabulary_ops.cc) against its TF ops.

The TF ops are the reference (`test_vocabulary_index.py` holds them to the
NumPy twin): on the same streams and policies (every eviction, admission
by count and by chance, both unknown kinds, string ids, int64 extremes, an
empty batch, tables that fill), the fused index gives the same rows and
rows to reset, and holds the same state, counters and hash table after
every step, as the twin and as a TF-ops index beside it. Then int64 steps
(wrapping ages, ties at the extremes), checkpoints of one path read by the
other, where each path runs (never the fused op in an XLA context), and the
backend's wiring (with `RECSYS_FUSED_KERNELS=0` its indices run the TF ops:
test_fused_kernels.py's test of the switch, in its own process).
"""

import numpy as np
import pytest
import tensorflow as tf

from backends.layout import TableLayout
from backends.tensorcore import kernels
from backends.tensorcore.backend import TensorCoreEmbedding
from backends.vocabulary import DynamicVocabulary, VocabularyIndex
from tests.backends import test_vocabulary_index as spec
from tests.backends.vocabulary_reference import ReferenceIndex

INT64_MIN, INT64_MAX = spec.INT64_MIN, spec.INT64_MAX


@pytest.fixture(scope="module")
def ops():
  loaded = kernels.load()
  if loaded is None:
    pytest.skip("the fused CPU kernels are unavailable here (no compiler?)")
  return loaded


class _Pair:
  """A TF-ops index and a fused index of one table, fed the same steps."""

  def __init__(self, ops, vocabulary_size, policy):
    self.tf = VocabularyIndex("items", vocabulary_size, policy)
    self.fused = VocabularyIndex(
      "items", vocabulary_size, policy, fused_ops=ops
    )
    self._functions = {}

  def update(self, ids, step, compiled):
    """Both updates of one step, as plain lists; the states must agree."""
    outputs = []
    for index in (self.tf, self.fused):
      update = index.update
      if compiled:
        key = (id(index), ids.dtype.kind)
        if key not in self._functions:
          dtype = tf.string if ids.dtype == object else tf.int64
          self._functions[key] = spec._function(index, dtype)
        update = self._functions[key]
      got = update(tf.constant(ids), tf.constant(step, tf.int64))
      outputs.append(
        (got.rows.numpy().tolist(), got.reset_rows.numpy().tolist())
      )
    assert outputs[0] == outputs[1], f"step {step}"
    assert spec._snapshot(self.fused) == spec._snapshot(self.tf), f"step {step}"
    return outputs[1]


@pytest.mark.parametrize("settings,vocabulary_size,case", spec.CASES)
def test_fused_update_matches_the_tf_ops_and_the_twin(
  ops, settings, vocabulary_size, case
):
  """Every policy of test_vocabulary_index on its stream (eager for even
  cases, in a tf.function for odd ones; strings for a third of them)."""
  compiled = case % 2 == 1
  policy = DynamicVocabulary(**settings)
  strings = (case + compiled) % 3 == 0
  pair = _Pair(ops, vocabulary_size, policy)
  twin = ReferenceIndex(vocabulary_size, policy)
  stream = spec._stream(seed=2 * case + compiled, strings=strings)
  for t, (ids, keys) in enumerate(stream):
    step = case % 3 + t
    got = pair.update(ids, step, compiled)
    want = twin.update(keys, step)
    assert got == (want.rows, want.reset_rows), f"step {step}"
    spec._assert_same_state(pair.fused, twin)


@pytest.mark.parametrize(
  "settings",
  [
    {"eviction": "lru"},
    {"eviction": "lfu", "admit_probability": 0.5, "seed": INT64_MIN},
    {"eviction": "age", "max_age": 1, "evict_every": 3},
    {"eviction": "age", "max_age": INT64_MAX},
  ],
  ids=["lru", "lfu-lucky", "age-every3", "age-forever"],
)
def test_int64_steps_agree_with_the_tf_ops(ops, settings):
  """Steps anywhere in int64, out of order: ages wrap (step - last_seen),
  the admission draw takes the step's bits, sweeps follow floor modulo,
  and rows last seen at INT64_MAX score INT64_MIN (~score), tying with
  the rows top_k may not take: the fused victims are still top_k's."""
  policy = DynamicVocabulary(**settings)
  pair = _Pair(ops, 5, policy)
  steps = [INT64_MAX, INT64_MAX, INT64_MIN, -1, 0, INT64_MAX - 1, 6, -9, 7, 8]
  rng = np.random.default_rng(1)
  for k, step in enumerate(steps):
    ids = rng.integers(0, 4 + 2 * k, 9).astype(np.int64)
    ids[0] = spec.EXTREMES[k % len(spec.EXTREMES)]
    pair.update(ids, step, compiled=k % 2 == 1)
  counters = {k: int(v) for k, v in pair.fused.counters().items()}
  assert counters["admissions"] > 5  # rows were taken back


@pytest.mark.parametrize("writer", ["tf", "fused"])
def test_a_checkpoint_of_one_path_is_read_by_the_other(ops, writer, tmp_path):
  """Five steps on one path, a checkpoint, five more on each path from it:
  the same outputs and state (the two paths share one state)."""
  policy = DynamicVocabulary(eviction="age", max_age=2, admit_after=2, seed=3)
  stream = spec._stream(seed=11, steps=10)
  first = VocabularyIndex(
    "items", spec.SMALL, policy, fused_ops=ops if writer == "fused" else None
  )
  for step, (ids, _) in enumerate(stream[:5]):
    first.update(tf.constant(ids), tf.constant(step, tf.int64))
  path = tf.train.Checkpoint(index=first).write(str(tmp_path / "ckpt"))
  pair = _Pair(ops, spec.SMALL, policy)
  for index in (pair.tf, pair.fused):
    tf.train.Checkpoint(index=index).read(path).assert_consumed()
    assert spec._snapshot(index) == spec._snapshot(first)
  for step, (ids, _) in enumerate(stream[5:], start=5):
    pair.update(ids, step, compiled=step % 2 == 0)


@pytest.mark.parametrize("compiled", [False, True])
def test_pieces_padded_and_flat_agree_with_one_flat_update(ops, compiled):
  """`update_pieces` (padded bags with garbage past their lengths, a bag
  longer than its width, flat ids between) on the fused op and on the TF
  ops: each piece's rows in its shape (0 past a bag's length) are the
  rows one flat update of the batch's ids gives, state and all."""
  policy = DynamicVocabulary(eviction="lru", admit_after=2)
  pair = _Pair(ops, 7, policy)
  flat = VocabularyIndex("items", 7, policy)
  updates = {
    index: tf.function(index.update_pieces) if compiled else index.update_pieces
    for index in (pair.tf, pair.fused)
  }
  rng = np.random.default_rng(4)
  for step in range(6):
    padded = rng.integers(0, 12, (5, 3)).astype(np.int64)
    lengths = np.array([3, 0, 1, 5, 2], np.int64)
    loose = rng.integers(0, 12, 4).astype(np.int64)
    real = np.arange(3)[None, :] < np.minimum(lengths, 3)[:, None]
    want = flat.update(
      tf.constant(np.concatenate([padded[real], loose, padded[real]])),
      tf.constant(step, tf.int64),
    )
    want_rows = want.rows.numpy()
    n = int(real.sum())
    for index, update in updates.items():
      pieces = [
        (tf.constant(padded), tf.constant(lengths)),
        (tf.constant(loose), None),
        (tf.constant(padded), tf.constant(lengths, tf.int32)),
      ]
      (first, middle, last), reset = update(pieces, tf.constant(step))
      for got, rows in ((first, want_rows[:n]), (last, want_rows[-n:])):
        expected = np.zeros((5, 3), np.int64)
        expected[real] = rows
        np.testing.assert_array_equal(got.numpy(), expected)
      np.testing.assert_array_equal(middle.numpy(), want_rows[n:-n])
      np.testing.assert_array_equal(reset.numpy(), want.reset_rows.numpy())
      assert spec._snapshot(index) == spec._snapshot(flat), f"step {step}"


def _op_types(function, *specs):
  graph = function.get_concrete_function(*specs).graph
  return {op.type for op in graph.get_operations()}


def test_the_fused_op_runs_outside_xla_only(ops):
  fused = _Pair(ops, spec.SMALL, DynamicVocabulary(eviction="lfu")).fused
  specs = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64))
  traced = _op_types(tf.function(fused.update), *specs)
  assert "RecsysVocabularyUpdate" in traced
  assert "UniqueWithCounts" not in traced
  # Traced for XLA (never run: a hash table has no XLA kernel): TF ops.
  compiled = _op_types(tf.function(fused.update, jit_compile=True), *specs)
  assert "RecsysVocabularyUpdate" not in compiled
  assert "UniqueWithCounts" in compiled


def test_ops_without_the_update_are_refused():
  with pytest.raises(TypeError, match="recsys_vocabulary_update"):
    VocabularyIndex("items", 10, DynamicVocabulary(), fused_ops=object())


def dynamic_backend(fused_kernels=True):
  """A tensorcore backend with one dynamic table "t" (feature "f"), built
  (test_fused_kernels.py builds it with the kernels switched off)."""
  table = tf.tpu.experimental.embedding.TableConfig(
    vocabulary_size=spec.SMALL, dim=3, name="t"
  )
  emb = TensorCoreEmbedding(
    {"f": tf.tpu.experimental.embedding.FeatureConfig(table=table)},
    tf.tpu.experimental.embedding.SGD(0.1),
    layouts={"t": TableLayout(vocabulary=DynamicVocabulary(eviction="lfu"))},
    fused_kernels=fused_kernels,
  )
  emb.build()
  return emb


def test_the_backend_gives_its_kernels_to_the_indices(ops):
  del ops  # loaded: the backend's kernels.load() returns them
  assert dynamic_backend().dynamic_tables()["t"].fused
  assert not dynamic_backend(fused_kernels=False).dynamic_tables()["t"].fused
