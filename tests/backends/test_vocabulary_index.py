"""`backends.vocabulary.VocabularyIndex` against its NumPy twin.

The twin (`tests/backends/vocabulary_reference.py`) is written from the
index's specification without TensorFlow; both take the same streams of ids
(repeated ids, id ranges drifting step by step, int64 extremes, strings,
an empty batch) and every step's rows, rows to reset, counters and state
must be equal, eager and in a `tf.function`, and in cross-replica context
of a 2-replica MirroredStrategy. Nothing here is a hard-coded result: the
twin says what each step gives.
"""

import dataclasses

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

from backends.errors import BackendSettingsError
from backends.vocabulary import (
  DynamicVocabulary,
  IndexUpdate,
  VocabularyIdsError,
  VocabularyIndex,
  VocabularySettingError,
)
from tests.backends.vocabulary_reference import ReferenceIndex
from tests.conftest import mirrored_strategy

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EXTREMES = (INT64_MIN, INT64_MAX, -1, 0, INT64_MIN + 1)
STEPS, BATCH = 8, 24
#: Distinct ids a stream holds: ~100 (`_stream`); the small table holds
#: fewer, the large more.
SMALL, LARGE = 23, 200
#: Seeds of the hashes, int64 extremes among them.
SEEDS = (0, -7, INT64_MAX, 12345, INT64_MIN)


def _string_keys(strings):
  """The 64-bit ids of strings: tf.fingerprint's 8 bytes, little-endian."""
  prints = tf.fingerprint(tf.constant(strings, tf.string)).numpy()
  return [int.from_bytes(p.tobytes(), "little", signed=True) for p in prints]


def _stream(seed, strings=False, steps=STEPS, batch=BATCH):
  """[(ids for the index, the same ids as int64 values for the twin)]: ids
  from a window of 30 drifting by 6 a step, with repeats, two int64
  extremes a step, an empty batch (step 3) and a wide one (step 5: more
  distinct ids than the small table has rows)."""
  rng = np.random.default_rng(seed)
  out = []
  for t in range(steps):
    if t == 3:
      ids = []
    else:
      size, width = (3 * batch, 60) if t == 5 else (batch, 30)
      ids = [int(i) for i in rng.integers(6 * t, 6 * t + width, size)]
      for k in rng.choice(size, 2, replace=False):
        ids[k] = EXTREMES[int(rng.integers(len(EXTREMES)))]
    if strings:
      text = [f"item-{i}" for i in ids]
      out.append((np.array(text, dtype=object), _string_keys(text)))
    else:
      out.append((np.array(ids, np.int64), ids))
  return out


def _function(index, dtype):
  spec = [tf.TensorSpec([None], dtype), tf.TensorSpec([], tf.int64)]
  return tf.function(index.update, input_signature=spec)


def _values(variable):
  """A variable's value on every replica (one, without a strategy)."""
  return [v.numpy() for v in getattr(variable, "values", [variable])]


def _assert_same_state(index, twin):
  for name in ("keys", "occupied", "counts", "last_seen"):
    for value in _values(getattr(index, name)):
      np.testing.assert_array_equal(value, getattr(twin, name), err_msg=name)
  np.testing.assert_array_equal(index.sketch.numpy(), twin.sketch)
  for value in _values(index.sketch_cells):
    np.testing.assert_array_equal(value, twin.sketch.reshape(-1))
  counters = {k: int(v) for k, v in index.counters().items()}
  assert counters == twin.counters
  keys, rows = index.mapping()
  assert (keys.numpy().tolist(), rows.numpy().tolist()) == twin.mapping()
  exported_keys, exported_rows = index.table.export()
  table = dict(
    zip(exported_keys.numpy().tolist(), exported_rows.numpy().tolist())
  )
  assert table == twin.table


def _run(index, twin, stream, update, first_step=0, same=None):
  """Feeds the stream to both, comparing after every step (the state by
  `same`, default `_assert_same_state`); the outputs."""
  outputs = []
  for t, (ids, keys) in enumerate(stream):
    step = first_step + t
    got = update(tf.constant(ids), tf.constant(step, tf.int64))
    want = twin.update(keys, step)
    got = got.rows.numpy().tolist(), got.reset_rows.numpy().tolist()
    assert got == (want.rows, want.reset_rows), f"step {step}"
    (same or _assert_same_state)(index, twin)
    outputs.append(got)
  return outputs


# Every pair of levels of the four two-level factors (admit_after,
# admit_probability, unknown, table size) in 5 rows (a covering array), for
# each eviction: 20 policies, not 64. Eviction "age" alternates between a
# sweep every other step and one every step.
_PAIRS = ((0, 0, 0, 0), (0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0))
_AGES = ({"max_age": 2, "evict_every": 2}, {"max_age": 1})


def _cases():
  for e, eviction in enumerate(("none", "lru", "lfu", "age")):
    for r, (admit, lucky, unknown, large) in enumerate(_PAIRS):
      settings = dict(
        eviction=eviction,
        admit_after=(1, 3)[admit],
        admit_probability=(1.0, 0.5)[lucky],
        unknown=("zeros", "unknown_row")[unknown],
        seed=SEEDS[(e + r) % len(SEEDS)],
        **(_AGES[r % 2] if eviction == "age" else {}),
      )
      size = (SMALL, LARGE)[large]
      name = "-".join(
        [
          eviction,
          f"after{settings['admit_after']}",
          f"p{settings['admit_probability']:g}",
          settings["unknown"],
          ("small", "large")[large],
        ]
      )
      yield pytest.param(settings, size, 5 * e + r, id=name)


CASES = list(_cases())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("settings,vocabulary_size,case", CASES)
def test_update_matches_the_twin(settings, vocabulary_size, case, compiled):
  policy = DynamicVocabulary(**settings)
  strings = (case + compiled) % 3 == 0
  index = VocabularyIndex("items", vocabulary_size, policy)
  twin = ReferenceIndex(vocabulary_size, policy)
  update = index.update
  if compiled:
    update = _function(index, tf.string if strings else tf.int64)
  stream = _stream(seed=2 * case + compiled, strings=strings)
  _run(index, twin, stream, update, first_step=case % 3)
  assert index.default_row == twin.default_row


def test_the_streams_exercise_every_path():
  """The twin's own counts: the streams above admit, refuse, evict (victims
  and sweeps) and fill the small table, so the comparison means something."""
  seen = {}
  for param in CASES:
    settings, vocabulary_size, case = param.values
    twin = ReferenceIndex(vocabulary_size, DynamicVocabulary(**settings))
    _replay(twin, _stream(seed=2 * case), first_step=case % 3)
    seen[param.id] = twin.counters
  for eviction in ("none", "lru", "lfu", "age"):
    small = [
      c
      for i, c in seen.items()
      if i.startswith(f"{eviction}-") and "small" in i
    ]
    assert any(c["rows_in_use"] == c["capacity"] for c in small), eviction
    if eviction != "none":
      assert all(c["evictions"] > 0 for c in small), eviction
  for i, c in seen.items():
    assert c["admissions"] > 0 and c["refused"] > 0, i
    assert c["evictions"] == 0 or not i.startswith("none"), i
  # Eviction with more candidates than rows not seen at the step (step 5).
  assert seen["lru-after1-p1-zeros-small"]["refused"] > 0
  # Sweeps free rows that nothing takes back.
  assert seen["age-after1-p0.5-unknown_row-large"]["evictions"] > 0


def _replay(twin, stream, first_step=0):
  for t, (_, keys) in enumerate(stream):
    twin.update(keys, first_step + t)


def test_update_under_a_mirrored_strategy():
  """Made in the strategy's scope, the index is still one plain copy on
  the host (updated once per step in cross-replica context, not once per
  replica); updated in a tf.function there: the same results."""
  strategy = mirrored_strategy(2)
  policy = DynamicVocabulary(eviction="age", max_age=1, admit_after=2)
  with strategy.scope():
    index = VocabularyIndex("items", SMALL, policy)
  twin = ReferenceIndex(SMALL, policy)
  assert not isinstance(index.keys, tf.distribute.DistributedValues)
  assert "CPU:0" in index.keys.device
  _run(index, twin, _stream(seed=5), _function(index, tf.int64))


@pytest.mark.parametrize("eviction", ["lfu", "age"])
def test_checkpoint_restores_and_continues_identically(eviction, tmp_path):
  age = {"max_age": 2} if eviction == "age" else {}
  policy = DynamicVocabulary(eviction=eviction, admit_after=2, seed=3, **age)
  index, restored = checkpoint_round_trip(
    VocabularyIndex, ReferenceIndex, policy, tmp_path
  )
  assert _snapshot(restored) == _snapshot(index)


def checkpoint_round_trip(make_index, make_twin, policy, tmp_path, same=None):
  """5 steps, a checkpoint, 5 more; the checkpoint restored into a fresh
  index equals the twin replayed to step 5 and goes on to the same
  outputs. Returns (the index, the restored one)."""
  stream = _stream(seed=11, steps=10)
  index = make_index("items", SMALL, policy)
  twin = make_twin(SMALL, policy)
  _run(index, twin, stream[:5], index.update, same=same)
  path = tf.train.Checkpoint(index=index).write(str(tmp_path / "ckpt"))
  went_on = _run(index, twin, stream[5:], index.update, 5, same)

  restored = make_index("items", SMALL, policy)
  tf.train.Checkpoint(index=restored).read(path).assert_consumed()
  replay = make_twin(SMALL, policy)
  _replay(replay, stream[:5])
  (same or _assert_same_state)(restored, replay)
  update = _function(restored, tf.int64)
  assert _run(restored, replay, stream[5:], update, 5, same) == went_on
  return index, restored


def _snapshot(index):
  """Every piece of an index's state, as plain lists (comparable with ==)."""
  exported = sorted(zip(*(t.numpy().tolist() for t in index.table.export())))
  state = {
    name: getattr(index, name).numpy().tolist()
    for name in ("keys", "occupied", "counts", "last_seen", "sketch_cells")
  }
  counters = {k: int(v) for k, v in index.counters().items()}
  return state, counters, exported


def test_lookup_changes_nothing_and_agrees_with_update():
  policy = DynamicVocabulary(eviction="lru", admit_after=2)
  index = VocabularyIndex("items", SMALL, policy)
  lookup = tf.function(index.lookup)
  for step, (ids, _) in enumerate(_stream(seed=3)):
    before = _snapshot(index)
    eager, traced = index.lookup(ids).numpy(), lookup(tf.constant(ids)).numpy()
    assert _snapshot(index) == before
    np.testing.assert_array_equal(eager, traced)
    rows = index.update(tf.constant(ids), tf.constant(step, tf.int64)).rows
    rows = rows.numpy()
    known = eager >= 0  # ids seen at this step keep their rows
    np.testing.assert_array_equal(rows[known], eager[known])
    np.testing.assert_array_equal(index.lookup(ids), rows)


def test_lookup_reads_other_shapes_and_integer_dtypes():
  index = VocabularyIndex("items", SMALL, DynamicVocabulary())
  rows = index.update(tf.constant([[5, 6], [7, 5]], tf.int32), 0).rows
  assert rows.shape == [4]
  np.testing.assert_array_equal(
    index.lookup(tf.constant([5, 7, 8], tf.int64)), [rows[0], rows[2], -1]
  )
  np.testing.assert_array_equal(
    index.lookup(tf.constant([[6]], tf.uint8)), [rows[1]]
  )
  unknown = VocabularyIndex(
    "items", SMALL, DynamicVocabulary(unknown="unknown_row")
  )
  assert (unknown.default_row, index.default_row) == (SMALL - 1, None)


def test_an_update_is_what_a_tf_function_returns():
  index = VocabularyIndex("items", SMALL, DynamicVocabulary())
  update = tf.function(lambda ids: index.update(ids, tf.constant(0, tf.int64)))
  got = update(tf.constant([3, 4, 3], tf.int64))
  assert isinstance(got, IndexUpdate)
  assert got.rows.dtype == got.reset_rows.dtype == tf.int64


_ID_LISTS = st.lists(
  st.lists(
    st.one_of(st.integers(0, 40), st.sampled_from(EXTREMES)), max_size=12
  ),
  min_size=1,
  max_size=6,
)


@hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
@hypothesis.given(
  batches=_ID_LISTS, eviction=st.sampled_from(["none", "lru", "lfu"])
)
def test_no_two_ids_share_a_row_below_capacity(batches, eviction):
  """With room for every id (45 distinct at most, 50 rows): each id keeps
  the row it first got, no two ids share a row, and a row is reset exactly
  once, when its id gets it."""
  index = VocabularyIndex("items", 50, DynamicVocabulary(eviction=eviction))
  row_of = {}
  for step, ids in enumerate(batches):
    update = index.update(
      tf.constant(ids, tf.int64), tf.constant(step, tf.int64)
    )
    new = [i for i in dict.fromkeys(ids) if i not in row_of]
    for i, row in zip(ids, update.rows.numpy().tolist()):
      assert row == row_of.get(i, row) >= 0
      row_of[i] = row
    assert update.reset_rows.numpy().tolist() == [row_of[i] for i in new]
    assert len(set(row_of.values())) == len(row_of)


@hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
@hypothesis.given(
  batches=_ID_LISTS,
  eviction=st.sampled_from(["lru", "lfu", "age"]),
  admit_after=st.integers(1, 2),
)
def test_a_reused_row_is_reset_exactly_when_reused(
  batches, eviction, admit_after
):
  """A small table (5 rows): after each step, the rows whose id changed (or
  that got one) are exactly the rows to reset, each once; no two ids hold
  one row."""
  age = {"max_age": 1} if eviction == "age" else {}
  policy = DynamicVocabulary(eviction=eviction, admit_after=admit_after, **age)
  index = VocabularyIndex("items", 5, policy)
  holder = {}
  for step, ids in enumerate(batches):
    update = index.update(
      tf.constant(ids, tf.int64), tf.constant(step, tf.int64)
    )
    keys, rows = (t.numpy().tolist() for t in index.mapping())
    now = dict(zip(rows, keys))
    changed = [r for r, k in now.items() if holder.get(r) != k]
    reset = update.reset_rows.numpy().tolist()
    assert sorted(reset) == sorted(changed) and len(set(reset)) == len(reset)
    assert len(set(keys)) == len(keys)
    holder = now


def _refused(kwargs, vocabulary_size=None):
  with pytest.raises(VocabularySettingError) as caught:
    policy = DynamicVocabulary(**kwargs)
    if vocabulary_size is not None:
      VocabularyIndex("user_ids", vocabulary_size, policy)
  assert isinstance(caught.value, BackendSettingsError)
  assert isinstance(caught.value, ValueError)
  return str(caught.value)


@pytest.mark.parametrize(
  "kwargs,setting,given",
  [
    ({"admit_after": 0}, "admit_after", "0"),
    ({"admit_after": -3}, "admit_after", "-3"),
    ({"admit_after": 1.5}, "admit_after", "1.5"),
    ({"admit_after": True}, "admit_after", "True"),
    ({"admit_after": "2"}, "admit_after", "'2'"),
    ({"admit_after": 2**63}, "admit_after", str(2**63)),
    ({"admit_probability": 0}, "admit_probability", "0"),
    ({"admit_probability": float("nan")}, "admit_probability", "nan"),
    ({"admit_probability": 1.5}, "admit_probability", "1.5"),
    ({"admit_probability": float("inf")}, "admit_probability", "inf"),
    ({"admit_probability": -0.5}, "admit_probability", "-0.5"),
    ({"admit_probability": True}, "admit_probability", "True"),
    ({"admit_probability": None}, "admit_probability", "None"),
    ({"eviction": 3}, "eviction", "3"),
    ({"max_age": -1, "eviction": "age"}, "max_age", "-1"),
    ({"evict_every": 0, "eviction": "age", "max_age": 1}, "evict_every", "0"),
    ({"sketch_width": 8}, "sketch_width", "8"),
    ({"sketch_width": 2**33}, "sketch_width", str(2**33)),
    ({"sketch_width": -1}, "sketch_width", "-1"),
    ({"seed": 2**63}, "seed", str(2**63)),
    ({"seed": 1.0}, "seed", "1.0"),
    ({"shards": 0}, "shards", "0"),
    ({"shards": 2.0}, "shards", "2.0"),
  ],
)
def test_a_setting_out_of_range_is_refused(kwargs, setting, given):
  message = _refused(kwargs)
  assert f"DynamicVocabulary.{setting} = {given}" in message


@pytest.mark.parametrize(
  "kwargs,setting,closest",
  [
    ({"eviction": "lur"}, "eviction", "lru"),
    ({"eviction": "LFU "}, "eviction", "lfu"),
    ({"unknown": "zero"}, "unknown", "zeros"),
    ({"unknown": "unknown_rows"}, "unknown", "unknown_row"),
  ],
)
def test_a_misspelt_choice_names_the_closest(kwargs, setting, closest):
  message = _refused(kwargs)
  assert f"DynamicVocabulary.{setting} = {kwargs[setting]!r}" in message
  assert f"Did you mean {closest!r}?" in message


@pytest.mark.parametrize(
  "kwargs,setting",
  [
    ({"max_age": 5}, "max_age"),
    ({"max_age": 5, "eviction": "lfu"}, "max_age"),
    ({"eviction": "age"}, "max_age"),
    ({"evict_every": 2}, "evict_every"),
    ({"evict_every": 3, "eviction": "none"}, "evict_every"),
  ],
)
def test_contradicting_settings_are_refused(kwargs, setting):
  message = _refused(kwargs)
  assert f"DynamicVocabulary.{setting} = " in message
  assert "eviction" in message and '"age"' in message


@pytest.mark.parametrize(
  "kwargs,vocabulary_size,setting",
  [
    ({}, 0, "vocabulary_size = 0"),
    ({}, -5, "vocabulary_size = -5"),
    ({}, 2.0, "vocabulary_size = 2.0"),
    ({}, True, "vocabulary_size = True"),
    ({"unknown": "unknown_row"}, 1, "vocabulary_size = 1"),
    ({"admit_after": 2}, 2**61, "DynamicVocabulary.sketch_width = 0"),
    ({"shards": 11}, 10, "DynamicVocabulary.shards = 11 for 10 id rows"),
    (
      {"shards": 10, "unknown": "unknown_row"},
      10,
      "DynamicVocabulary.shards = 10 for 9 id rows",
    ),
  ],
)
def test_what_the_table_cannot_have_is_refused_naming_it(
  kwargs, vocabulary_size, setting
):
  message = _refused(kwargs, vocabulary_size)
  assert "table 'user_ids'" in message and setting in message
  policy = DynamicVocabulary(**kwargs)
  with pytest.raises(VocabularySettingError, match="user_ids"):
    policy.check("user_ids", vocabulary_size)


def test_a_policy_that_is_not_a_dynamic_vocabulary_is_refused():
  with pytest.raises(
    VocabularySettingError, match="table 'user_ids'.*DynamicVocabulary"
  ):
    VocabularyIndex("user_ids", 10, {"admit_after": 2})


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.bool])
def test_ids_of_another_dtype_are_refused(dtype):
  index = VocabularyIndex("user_ids", 10, DynamicVocabulary())
  ids = tf.cast(tf.constant([1, 2]), dtype)
  for call in (
    lambda: index.update(ids, 0),
    lambda: index.lookup(ids),
    lambda: tf.function(index.update)(ids, tf.constant(0, tf.int64)),
  ):
    with pytest.raises(VocabularyIdsError, match=f"'user_ids'.*{dtype.name}"):
      call()
  with pytest.raises(VocabularyIdsError, match="flat_values"):
    index.update(tf.ragged.constant([[1], [2, 3]], tf.int64), 0)


def test_settings_are_held_as_declared():
  policy = DynamicVocabulary(
    admit_after=np.int64(2), admit_probability=1, eviction="age", max_age=3
  )
  assert (
    type(policy.admit_after) is int and type(policy.admit_probability) is float
  )
  assert policy.eviction == "age" and policy.unknown == "zeros"
  assert policy.id_rows(10) == 10
  assert dataclasses.replace(policy, unknown="unknown_row").id_rows(10) == 9
  assert policy.sketch_columns(10) == 1024
  assert policy.sketch_columns(1000) == 4096
  assert dataclasses.replace(policy, sketch_width=100).sketch_columns(10) == 100
  # Admitted at first sight: the sketch decides nothing, so it is tiny.
  assert dataclasses.replace(policy, admit_after=1).sketch_columns(1000) == 16


def test_index_bytes_counts_the_state():
  small = VocabularyIndex("items", 100, DynamicVocabulary(sketch_width=16))
  large = VocabularyIndex("items", 200, DynamicVocabulary(sketch_width=16))
  wide = VocabularyIndex("items", 100, DynamicVocabulary(sketch_width=32))
  held = sum(v.numpy().nbytes for v in small.variables)
  assert small.index_bytes() > held  # and the hash table
  assert large.index_bytes() - small.index_bytes() > 100 * 25
  assert wide.index_bytes() - small.index_bytes() == 16 * 2 * 8
