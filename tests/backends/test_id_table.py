"""`RecsysIdTable` (backends/tensorcore/kernels/id_table.h), the dynamic
index's open-addressing id -> row table, through TF's own lookup ops,
against a Python dict.

Small capacities make long probe runs that wrap around the slot array, and
removals in the middle of them (the backward shift that replaces
tombstones); inserts past the capacity make the table grow. After every
batch each find, `size()` and the export agree with the dict.
"""

import numpy as np
import pytest
import tensorflow as tf

from backends.vocabulary import index as index_lib
from tests.backends.test_vocabulary_fused import ops  # noqa: F401 (fixture)


def _table(ops, capacity, name="ids"):
  return index_lib._id_table(ops, capacity, name)  # noqa: SLF001


def _check(table, reference, probes):
  found = table.lookup(tf.constant(probes, tf.int64)).numpy()
  want = [reference.get(int(k), -1) for k in probes]
  np.testing.assert_array_equal(found, want)
  assert int(table.size()) == len(reference)
  keys, rows = (t.numpy() for t in table.export())
  assert dict(zip(keys.tolist(), rows.tolist())) == reference


@pytest.mark.parametrize("capacity", [1, 16, 1000])
def test_finds_inserts_and_removals_agree_with_a_dict(ops, capacity):
  table = _table(ops, capacity)
  assert isinstance(table, index_lib._IdTable)  # noqa: SLF001
  rng = np.random.default_rng(capacity)
  reference: dict[int, int] = {}
  # Few distinct keys (many collisions in a small table), int64 extremes.
  universe = np.concatenate(
    [
      rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64),
      np.array([0, -1, 2**63 - 1, -(2**63)], np.int64),
    ]
  )
  for step in range(60):
    keys = np.unique(rng.choice(universe, rng.integers(1, 40)))
    if step % 3 == 2:
      table.remove(tf.constant(keys))
      for k in keys.tolist():
        reference.pop(k, None)
    else:
      rows = rng.integers(0, 10**6, keys.size)
      table.insert(tf.constant(keys), tf.constant(rows, tf.int64))
      reference.update(zip(keys.tolist(), rows.tolist()))
    _check(table, reference, rng.choice(universe, 64))


def test_a_default_per_key_and_an_empty_table(ops):
  table = _table(ops, 4)
  _check(table, {}, [1, 2])
  table.insert(tf.constant([5], tf.int64), tf.constant([7], tf.int64))
  got = table.lookup(
    tf.constant([5, 6], tf.int64),
    dynamic_default_values=tf.constant([-3, -4], tf.int64),
  )
  np.testing.assert_array_equal(got.numpy(), [7, -4])


def test_a_negative_row_is_refused_and_nothing_is_inserted(ops):
  table = _table(ops, 4)
  with pytest.raises(tf.errors.InvalidArgumentError, match="rows >= 0"):
    table.insert(tf.constant([1, 2], tf.int64), tf.constant([3, -1], tf.int64))
  assert int(table.size()) == 0


def test_checkpoints_restore_into_tf_mutable_hash_table_and_back(ops, tmp_path):
  ours = _table(ops, 100, "t")
  keys = tf.constant([3, -9, 2**40], tf.int64)
  ours.insert(keys, tf.constant([0, 1, 2], tf.int64))
  path = tf.train.Checkpoint(table=ours).write(str(tmp_path / "ours"))
  theirs = _table(None, 100, "t")
  assert not isinstance(theirs, index_lib._IdTable)  # noqa: SLF001
  tf.train.Checkpoint(table=theirs).read(path).assert_consumed()
  np.testing.assert_array_equal(theirs.lookup(keys).numpy(), [0, 1, 2])
  theirs.insert(tf.constant([11], tf.int64), tf.constant([3], tf.int64))
  path = tf.train.Checkpoint(table=theirs).write(str(tmp_path / "theirs"))
  back = _table(ops, 1, "t")
  tf.train.Checkpoint(table=back).read(path).assert_consumed()
  _check(back, {3: 0, -9: 1, 2**40: 2, 11: 3}, [3, 11, 12])
