"""SyntheticCTR with drift: windows of raw ids that slide, a known optimum.

Without drift nothing changes (`test_synthetic_ctr_identity.py` pins the
examples as they were before drift existed).
"""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import SyntheticConfigError, SyntheticCTR, drift, oracle
from recsys.ranges import SettingRangeError
from tests.data.test_synthetic_ctr import rows

#: C1 drifts one id per 10 examples, C2 does not, C3 (a bag) per 5.
DRIFT = dict(
  num_dense=3,
  vocab_sizes=(23, 11, 7),
  multi_hot_sizes=(1, 4, 2),
  weighted=(False, True, False),
  drift_every=(10, 0, 5),
  num_examples=5000,
  num_eval_examples=1000,
  oracle_examples=1 << 13,
)


def ids_of(features, name) -> np.ndarray:
  ids = features["categorical"][name]
  return (ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids).numpy()


def test_raw_ids_are_a_bijective_64_bit_mix():
  keys = [0, 1, 0x9E3779B97F4A7C15, (1 << 64) - 1]
  window = np.array(
    [0, 1, 2, 1 << 40, 2**63 - 1, -1, -(2**63)], np.int64
  )  # any int64 window id
  for key in keys:
    got = drift.raw_id(key, tf.constant(window)).numpy()
    assert got.dtype == np.int64
    assert got.tolist() == [drift.raw_id_py(key, int(w)) for w in window]
  # Distinct window ids of one key never share a raw id; the values look
  # nothing like the window ids (large, both signs).
  raw = drift.raw_id(keys[2], tf.range(100_000, dtype=tf.int64)).numpy()
  assert len(np.unique(raw)) == 100_000
  assert np.abs(raw).min() > 2**40 and (raw < 0).any() and (raw > 0).any()


def test_window_ids_take_one_id_of_each_residue():
  residue = tf.constant([[0, 1, 2, 3, 4, 5, 6]], tf.int64)
  for start in (0, 3, 7, 12, 1000):
    ids = drift.window_ids(residue, tf.constant([[start]], tf.int64), 7)
    ids = ids.numpy()[0]
    assert sorted(ids) == list(range(start, start + 7))
    assert (ids % 7 == np.arange(7)).all()


def test_specs_say_which_ids_are_raw():
  source = SyntheticCTR(**DRIFT)
  specs = {s.name: s for s in source.feature_specs}
  assert [specs[n].raw_ids for n in ("C1", "C2", "C3")] == [True, False, True]
  assert [specs[n].vocabulary_size for n in ("C1", "C2", "C3")] == [23, 11, 7]
  assert source.eval_start == 4000 and source.drift_every == [10, 0, 5]


def test_ids_follow_the_draws_without_drift():
  """The window starts at 0: its ids are the raw ids of the ids the same
  seed draws without drift (Zipf-skewed as without drift); a feature
  without drift delivers exactly its ids without drift."""
  plain = SyntheticCTR(**{**DRIFT, "drift_every": 0})
  drifting = SyntheticCTR(**DRIFT)
  index = tf.range(5, dtype=tf.int64)  # positions < 5: every window at 0
  before, _ = plain.examples(index)
  after, _ = drifting.examples(index)
  for name in ("C1", "C3"):
    np.testing.assert_array_equal(
      ids_of(after, name), drifting.delivered_ids(name, ids_of(before, name))
    )
  np.testing.assert_array_equal(ids_of(after, "C2"), ids_of(before, "C2"))
  assert drifting.window("C2", 4999) == range(0, 11)


def test_the_ids_of_a_stretch_are_exactly_its_windows():
  """Uniform draws over a window of 7 that moves every 50 examples: the ids
  of examples [a, b) are the windows' ids, one new id per 50 examples,
  the old ones gone."""
  source = SyntheticCTR(
    num_dense=0,
    vocab_sizes=(7,),
    multi_hot_sizes=(2,),
    zipf_exponent=0.0,
    drift_every=50,
    num_examples=4000,
    num_eval_examples=500,
    oracle_examples=1 << 10,
  )
  a, b = 1000, 3000
  features, _ = source.examples(tf.range(a, b, dtype=tf.int64))
  seen = set(ids_of(features, "C1").tolist())
  first, last = source.window("C1", a), source.window("C1", b - 1)
  assert (first, last) == (range(20, 27), range(59, 66))
  assert seen == set(source.delivered_ids("C1", range(20, 66)).tolist())
  # 46 ids: the first window's 7 and one more every 50 examples.
  assert len(seen) == 7 + (b - 1) // 50 - a // 50
  # The evaluation split samples the last 500 positions: windows 70..79.
  features, _ = source.examples(tf.range(500, dtype=tf.int64), training=False)
  assert set(ids_of(features, "C1").tolist()) == set(
    source.delivered_ids("C1", range(70, 86)).tolist()
  )


def test_skewed_ids_stay_in_their_windows_and_outnumber_them():
  source = SyntheticCTR(**DRIFT)
  n = 5000
  features, _ = source.examples(tf.range(n, dtype=tf.int64))
  for name, every, size in (("C1", 10, 23), ("C3", 5, 7)):
    ids = ids_of(features, name)
    possible = source.delivered_ids(name, range(0, (n - 1) // every + size))
    assert set(ids.tolist()) <= set(possible.tolist())
    # Far more ids than the window over the stream: a table of the
    # window's size must evict.
    assert len(np.unique(ids)) > 0.8 * len(possible) > 10 * size
    # A late stretch holds none of the early windows' ids.
    late = ids_of(
      source.examples(tf.range(4000, 4100, dtype=tf.int64))[0], name
    )
    gone = source.delivered_ids(name, range(0, 4000 // every))
    assert not set(late.tolist()) & set(gone.tolist())


def test_same_examples_for_any_batch_size_or_sharding():
  source = SyntheticCTR(
    **{**DRIFT, "num_examples": 53, "num_eval_examples": 20}
  )
  for training, total in ((True, 53), (False, 20)):
    whole = rows(
      *source.examples(tf.range(total, dtype=tf.int64), training=training)
    )
    for size in (5, 7):
      batches = source.dataset(
        size, training=training, drop_remainder=False, repeat=False
      )
      assert [r for f, l in batches for r in rows(f, l)] == whole
    shards = []
    for pipeline in range(2):
      ctx = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=pipeline
      )
      shards += [
        r
        for f, l in source.dataset(
          5,
          training=training,
          input_context=ctx,
          drop_remainder=False,
          repeat=False,
        )
        for r in rows(f, l)
      ]
    assert sorted(shards) == sorted(whole)
  again = SyntheticCTR(**{**DRIFT, "num_examples": 53, "num_eval_examples": 20})
  index = tf.constant([0, 17, 52], tf.int64)
  assert rows(*again.examples(index)) == rows(*source.examples(index))


def test_far_positions_need_no_table_of_every_id():
  source = SyntheticCTR(**{**DRIFT, "num_examples": 2**50})
  index = tf.constant([0, 2**40, 2**49], tf.int64)
  features, labels = source.examples(index)
  assert source.window("C1", 2**49) == range(2**49 // 10, 2**49 // 10 + 23)
  c1 = ids_of(features, "C1")
  late = source.delivered_ids("C1", source.window("C1", 2**49))
  assert c1[2] in late and c1[0] not in late
  assert np.isfinite(source.probabilities(features).numpy()).all()


def test_labels_follow_the_true_probabilities_and_the_oracle_knows_the_optimum():
  source = SyntheticCTR(
    **{**DRIFT, "num_examples": 60_000, "num_eval_examples": 40_000}
  )
  assert 0.65 < source.bayes_auc < 0.95
  assert source.bayes_logloss < source.constant_logloss
  features, labels = source.examples(
    tf.range(40_000, dtype=tf.int64), training=False
  )
  p, y = source.probabilities(features).numpy(), labels.numpy()
  # The labels were drawn from the planted model of the raw ids the batch
  # delivers: the true probabilities score the optimum the oracle reports.
  assert oracle.auc(p, y) == pytest.approx(source.bayes_auc, abs=0.01)
  assert y.mean() == pytest.approx(p.mean(), abs=0.01)
  # Shuffling the drifting features' ids between examples (same window,
  # same popularity) loses what their factors said.
  c1 = features["categorical"]["C1"]
  shuffled = dict(features["categorical"], C1=tf.random.shuffle(c1, seed=1))
  q = source.probabilities({**features, "categorical": shuffled}).numpy()
  assert oracle.auc(q, y) < source.bayes_auc - 0.05


def test_drift_settings_are_checked():
  with pytest.raises(SyntheticConfigError, match="needs num_examples >= "):
    SyntheticCTR(**{**DRIFT, "num_examples": None})
  with pytest.raises(SyntheticConfigError, match="num_eval_examples=1000"):
    SyntheticCTR(**{**DRIFT, "num_examples": 999})
  with pytest.raises(SyntheticConfigError, match="drift_every has 2 entries"):
    SyntheticCTR(**{**DRIFT, "drift_every": (1, 2)})
  for bad in (-1, 1.5, True, (1, -2, 0), "10"):
    with pytest.raises(SettingRangeError, match="SyntheticCTR.drift_every"):
      SyntheticCTR(**{**DRIFT, "drift_every": bad})
