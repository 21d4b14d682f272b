"""Bayes-metric helpers against brute-force pair counting and Keras' AUC."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import oracle


def brute_expected_auc(s, p):
  num = den = 0.0
  for i, j in itertools.permutations(range(len(s)), 2):
    w = p[i] * (1 - p[j])
    den += w
    num += w * (1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0)
  return num / den


def test_expected_auc_matches_pair_enumeration():
  rng = np.random.default_rng(1)
  p = rng.uniform(0.05, 0.95, 23)
  scores = np.round(rng.normal(size=23), 1)  # ties on purpose
  assert oracle.expected_auc(scores, p) == pytest.approx(
    brute_expected_auc(scores, p), abs=1e-12
  )


def test_constant_scores_give_half():
  p = np.random.default_rng(2).uniform(0, 1, 101)
  assert oracle.expected_auc(np.zeros(101), p) == pytest.approx(0.5, abs=1e-12)


def test_auc_matches_keras_on_labels():
  rng = np.random.default_rng(3)
  labels = rng.integers(0, 2, 500)
  scores = rng.uniform(size=500) + 0.3 * labels
  metric = tf.keras.metrics.AUC(num_thresholds=20001)
  metric.update_state(labels, scores)
  assert oracle.auc(scores, labels) == pytest.approx(
    float(metric.result()), abs=2e-3
  )


def test_expected_logloss_is_entropy_for_truth():
  p = np.array([0.1, 0.5, 0.9])
  entropy = -(p * np.log(p) + (1 - p) * np.log(1 - p))
  assert oracle.expected_logloss(p, p) == pytest.approx(entropy.mean())
  assert oracle.expected_logloss(np.full(3, 0.5), p) > oracle.expected_logloss(
    p, p
  )
