"""The counter-based RNG: determinism, uniformity, Zipf frequencies."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import _random


def test_same_key_and_index_same_value_any_batching():
  index = tf.range(1000, dtype=tf.int64)
  whole = _random.uniform([_random.make_key(0, "a")], index).numpy()
  parts = np.concatenate(
    [
      _random.uniform([_random.make_key(0, "a")], index[i : i + 7]).numpy()
      for i in range(0, 1000, 7)
    ]
  )
  np.testing.assert_array_equal(whole, parts)
  other = _random.uniform([_random.make_key(1, "a")], index).numpy()
  assert np.mean(whole == other) < 0.01


def test_uniform_moments_and_column_independence():
  index = tf.range(200_000, dtype=tf.int64)[:, None]
  keys = np.array([[_random.make_key(5, "c", j) for j in range(3)]], np.uint32)
  u = _random.uniform(keys, index).numpy()
  assert u.min() >= 0.0 and u.max() < 1.0
  np.testing.assert_allclose(u.mean(axis=0), 0.5, atol=0.005)
  np.testing.assert_allclose(u.var(axis=0), 1 / 12, atol=0.002)
  corr = np.corrcoef(u.T)
  assert np.abs(corr - np.eye(3)).max() < 0.01
  # Large indices (upper 32 bits) are mixed too.
  high = _random.uniform(keys[:, :1], index + (1 << 33)).numpy()
  assert abs(np.corrcoef(high[:, 0], u[:, 0])[0, 1]) < 0.01


def test_normal_moments():
  index = tf.range(200_000, dtype=tf.int64)
  z = _random.normal([11], [12], index).numpy()
  assert z.mean() == pytest.approx(0.0, abs=0.01)
  assert z.std() == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("exponent", [0.0, 1.0, 1.05])
def test_zipf_ranks_follow_pmf(exponent):
  n, draws = 23, 200_000
  u = _random.uniform([3], tf.range(draws, dtype=tf.int64))
  ranks = _random.zipf_rank(u, n, exponent).numpy()
  freq = np.bincount(ranks, minlength=n) / draws
  pmf = _random.zipf_pmf(n, exponent)
  assert pmf.sum() == pytest.approx(1.0)
  np.testing.assert_allclose(freq, pmf, atol=4 * np.sqrt(pmf.max() / draws))


def test_logistic_is_finite_at_the_extremes_and_unit_variance():
  extremes = tf.constant([0.0, 1.0 - 2.0**-24], tf.float32)
  assert np.all(np.isfinite(_random.logistic(extremes).numpy()))
  z = _random.logistic(
    _random.uniform([9], tf.range(200_000, dtype=tf.int64))
  ).numpy()
  assert z.mean() == pytest.approx(0.0, abs=0.01)
  assert z.std() == pytest.approx(1.0, abs=0.02)
