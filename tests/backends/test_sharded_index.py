"""`backends.vocabulary.ShardedIndex` against its twin.

The twin (`ReferenceShardedIndex` in `tests/backends/vocabulary_reference.py`)
is written from the sharded index's specification: an id's shard by its
hash, each shard the single index's twin over its own rows, fed its ids in
order. Both take the streams of `test_vocabulary_index.py`; every step's
rows, rows to reset, counters, mapping and each shard's state must be
equal, with the TF ops and with the fused kernels, eager and in a
`tf.function`. Nothing here is a hard-coded result.
"""

import numpy as np
import pytest
import tensorflow as tf

from backends.tensorcore import kernels
from backends.vocabulary import DynamicVocabulary
from backends.vocabulary import index as index_lib
from backends.vocabulary.sharded import (
  NOT_HELD,
  ShardedIndex,
  ShardedIndexError,
)
from tests.backends import test_vocabulary_index as single
from tests.backends.vocabulary_reference import ReferenceShardedIndex

SMALL, LARGE = single.SMALL, single.LARGE


def _assert_same(index, twin):
  for shard, shard_twin in zip(index.shards, twin.shards):
    single._assert_same_state(shard, shard_twin)  # pylint: disable=protected-access
  assert {k: int(v) for k, v in index.counters().items()} == twin.counters
  keys, rows = index.mapping()
  assert (keys.numpy().tolist(), rows.numpy().tolist()) == twin.mapping()


def _run(index, twin, stream, update, first_step=0):
  return single._run(index, twin, stream, update, first_step, same=_assert_same)  # pylint: disable=protected-access


CASES = [
  ({"eviction": "lru"}, SMALL, 2),
  ({"eviction": "lfu", "admit_after": 2, "seed": -7}, SMALL, 3),
  ({"eviction": "none", "unknown": "unknown_row"}, SMALL, 4),
  ({"eviction": "age", "max_age": 1, "admit_probability": 0.5}, SMALL, 5),
  ({"eviction": "lru", "unknown": "unknown_row", "seed": 12345}, LARGE, 7),
]


# Each case with one of the four ways to run it (TF ops or fused, eager or
# compiled), in turn: the fused op and the TF ops agree for one index
# (test_vocabulary_fused.py); what is sharded here is the same code on both.
@pytest.mark.parametrize(
  "settings,vocabulary_size,shards,compiled,fused",
  [(*case, i % 2 == 1, i // 2 % 2 == 1) for i, case in enumerate(CASES)],
  ids=[
    f"{c[0]['eviction']}-{c[1]}rows-{c[2]}shards-"
    + ("eager", "function")[i % 2]
    + ("-tf_ops", "-fused")[i // 2 % 2]
    for i, c in enumerate(CASES)
  ],
)
def test_update_matches_the_twin(
  settings, vocabulary_size, shards, compiled, fused
):
  policy = DynamicVocabulary(shards=shards, **settings)
  strings = shards % 2 == 1 and compiled
  index = ShardedIndex(
    "items",
    vocabulary_size,
    policy,
    fused_ops=kernels.load() if fused else None,
  )
  assert index.fused == fused
  twin = ReferenceShardedIndex(vocabulary_size, policy)
  update = index.update
  if compiled:
    update = single._function(index, tf.string if strings else tf.int64)  # pylint: disable=protected-access
  stream = single._stream(seed=shards, strings=strings)  # pylint: disable=protected-access
  _run(index, twin, stream, update, first_step=shards % 3)
  assert index.default_row == twin.default_row


def test_the_streams_fill_shards_and_evict():
  """The comparison means something: in the small table every shard
  admits and fills and, but with eviction "none", evicts; and a shard
  evicts while the table still has rows free in another (the shards'
  documented cost)."""
  early = False
  for settings, size, shards in CASES[:4]:
    twin = ReferenceShardedIndex(
      size, DynamicVocabulary(shards=shards, **settings)
    )
    filled = [False] * shards
    for t, (_, keys) in enumerate(single._stream(seed=shards)):  # pylint: disable=protected-access
      before = twin.counters
      twin.update(keys, t)
      after = twin.counters
      if after["evictions"] > before["evictions"]:
        early |= before["rows_in_use"] < before["capacity"]
      for s, shard in enumerate(twin.shards):
        c = shard.counters
        filled[s] |= c["rows_in_use"] == c["capacity"]
    assert all(filled), settings
    for shard in twin.shards:
      c = shard.counters
      assert c["admissions"] > 0, settings
      assert settings["eviction"] == "none" or c["evictions"] > 0, settings
  assert early


def test_update_pieces_keeps_each_pieces_shape():
  policy = DynamicVocabulary(shards=3, unknown="unknown_row")
  index = ShardedIndex("items", SMALL, policy)
  twin = ReferenceShardedIndex(SMALL, policy)
  bags = np.array([[5, 2**40, 9], [7, 0, 0]], np.int64)
  flat = np.array([-1, 5, 2**62], np.int64)
  rows, reset = index.update_pieces(
    [(tf.constant(bags), tf.constant([3, 1])), (tf.constant(flat), None)], 0
  )
  want = twin.update([5, 2**40, 9, 7, -1, 5, 2**62], 0)
  assert rows[0].numpy().tolist() == [want.rows[:3], [want.rows[3], 0, 0]]
  assert rows[1].numpy().tolist() == want.rows[4:]
  assert reset.numpy().tolist() == want.reset_rows


def test_checkpoint_restores_and_continues_identically(tmp_path):
  """Saved by TF's own checkpoint (each state whole, `[N, 1]`), the id
  tables rebuilt on restore."""
  policy = DynamicVocabulary(shards=3, eviction="lfu", admit_after=2, seed=3)
  single.checkpoint_round_trip(
    ShardedIndex, ReferenceShardedIndex, policy, tmp_path, same=_assert_same
  )


def test_lookup_reads_what_update_gave():
  policy = DynamicVocabulary(shards=4)
  index = ShardedIndex("items", LARGE, policy)
  ids = tf.constant([3, 2**40, -8, 3, 77], tf.int64)
  rows = index.update(ids, 0).rows
  assert len(set(rows.numpy().tolist())) == 4  # distinct ids, distinct rows
  unseen = tf.constant([[3, 12345], [77, -8]], tf.int64)
  np.testing.assert_array_equal(
    index.lookup(unseen).numpy(), [rows[0], -1, rows[4], rows[2]]
  )
  before = {k: int(v) for k, v in index.counters().items()}
  index.lookup(unseen)
  assert {k: int(v) for k, v in index.counters().items()} == before


def test_index_bytes_are_the_shards():
  policy = DynamicVocabulary(shards=4, admit_after=2)
  whole = DynamicVocabulary(admit_after=2)
  shard_bytes = policy.shard_bytes(10_000)
  assert len(shard_bytes) == 4 and sum(shard_bytes) == policy.index_bytes(
    10_000
  )
  # Each shard's sketch is sized for its rows: the same state, in parts.
  assert abs(policy.index_bytes(10_000) - whole.index_bytes(10_000)) < 10_000
  assert policy.shard_bounds(10) == [0, 2, 5, 7, 10]


def test_processes_holding_shards_apart_hold_their_share():
  """Shard s on process s mod W (`backends.vocabulary.stage`): the most a
  process holds is its shards' bytes; the planner counts that share."""
  policy = DynamicVocabulary(shards=5, admit_after=2)
  each = policy.shard_bytes(10_000)
  assert policy.process_bytes(10_000, 1) == sum(each)
  assert policy.process_bytes(10_000, 2) == sum(each[0::2])  # 3 of 5
  assert policy.process_bytes(10_000, 5) == max(each)
  whole = DynamicVocabulary(admit_after=2)
  assert whole.process_bytes(10_000, 4) == whole.index_bytes(10_000)


def test_a_process_holding_some_shards_reads_the_others_as_not_held():
  """Worker processes hold shards apart: a process's update and lookup
  give `NOT_HELD` for the ids of shards it does not hold, and its own
  shards' rows as the whole index gives them."""
  policy = DynamicVocabulary(shards=3)
  whole = ShardedIndex("items", LARGE, policy)
  part = ShardedIndex("items", LARGE, policy, held=[0, 2])
  assert part.apart and not whole.apart
  ids = tf.constant(np.arange(40, dtype=np.int64) * 7919 + 2**41)
  want = whole.update(ids, 0).rows.numpy()
  got = part.update(ids, 0).rows.numpy()
  shard = index_lib.shard_of(ids, policy.seed, 3).numpy()
  np.testing.assert_array_equal(got[shard != 1], want[shard != 1])
  assert (got[shard == 1] == NOT_HELD).all() and (shard == 1).any()
  np.testing.assert_array_equal(part.lookup(ids).numpy(), got)


def test_a_plain_save_of_shards_held_elsewhere_is_refused(tmp_path):
  """TF's own save of an index whose other shards other processes hold
  would write a part as the whole: refused, naming the shards and the
  save that writes each process's (the Trainer's)."""
  part = ShardedIndex("items", SMALL, DynamicVocabulary(shards=3), held=[1])
  with pytest.raises(ShardedIndexError, match=r"holds shards \[1\] of 3"):
    tf.train.Checkpoint(index=part).write(str(tmp_path / "ckpt"))
