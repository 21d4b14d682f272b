"""A retrieval model's parts on their own: the loss task from what a loss
needs (no model, no loop), and the model wiring them (padding rows, hit
rates over its own index, the batch's seen items)."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys.models import LossInputs
from recsys.models.retrieval import seen_items
from recsys.models.retrieval.task import InBatchSoftmax
from tests.models import reference
from tests.models.test_two_tower import B, _batch, _model


def _arrays(n=6, k=4, seed=3):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(n, k)).astype(np.float32)
  c = rng.normal(size=(n, k)).astype(np.float32)
  ids = np.array([2, 5, 2, 7, 1, 2], np.int64)[:n]
  probability = rng.uniform(0.05, 0.5, n).astype(np.float32)
  weight = rng.uniform(0.5, 2.0, n).astype(np.float32)
  return q, c, ids, probability, weight


@pytest.mark.parametrize("logq", [0.0, 1.0, 0.5])
def test_the_loss_task_takes_only_what_a_loss_needs(logq):
  q, c, ids, probability, weight = _arrays()
  task = InBatchSoftmax(temperature=0.3, logq_correction=logq)
  features = {"candidate_sampling_probability": probability}
  p = task.sampling_probability(features, tf.float32)
  assert (p is None) == (logq == 0.0)
  per_query = task.loss(q, c, ids, p, sample_weight=weight).numpy()
  expected = reference.in_batch_softmax_loss(
    q,
    c,
    ids=ids,
    temperature=0.3,
    sampling_probability=probability if logq else None,
    logq_weight=logq,
  )
  np.testing.assert_allclose(per_query, weight * expected, rtol=1e-5)


def test_padding_rows_are_no_query_and_no_negative():
  q, c, ids, _, _ = _arrays()
  valid = np.array([True, True, False, True, True, False])
  task = InBatchSoftmax()
  per_query = task.loss(
    q, c, ids, sample_weight=valid.astype(np.float32), valid=valid
  ).numpy()
  expected = reference.in_batch_softmax_loss(q[valid], c[valid], ids[valid])
  np.testing.assert_allclose(per_query[valid], expected, rtol=1e-5)
  np.testing.assert_array_equal(per_query[~valid], 0.0)


def test_a_padding_row_weighted_0_is_no_query_and_no_negative():
  """The evaluation loop passes its padding mask as the example weights:
  rows weighted 0 count neither as queries nor as in-batch negatives."""
  model = _model()
  acts, features = _batch(item_ids=[3, 7, 3, 1, 4])
  mask = np.array([1, 0, 1, 1, 0], np.float32)
  valid = mask > 0
  q = model.query_embeddings(acts).numpy()
  c = model.candidate_embeddings(acts).numpy()
  expected = reference.in_batch_softmax_loss(
    q[valid],
    c[valid],
    ids=features["categorical"]["item"][valid],
    temperature=0.1,  # TwoTower's default
  )
  per_example = model.per_example_loss(  # as the evaluation step calls it
    LossInputs(
      acts,
      features,
      training=False,
      compute_metrics=False,
      sample_weight=mask,
    )
  ).numpy()
  np.testing.assert_allclose(per_example.sum(), expected.sum(), rtol=1e-5)
  assert (per_example[~valid] == 0).all()


def test_the_model_composes_its_index_hit_rates_and_exclusion():
  model = _model()
  listed = {id(m) for m in model.metrics}
  assert all(id(m) in listed for m in model.hit_rates._top_k_metrics)
  assert model.hit_rates._candidates is model.corpus_index
  acts, features = _batch(item_ids=[0, 1, 2, 3, 4])
  corpus = model.candidate_embeddings(acts).numpy()
  model.index_candidates(tf.range(B, dtype=tf.int64), corpus)
  q = model.query_embeddings(acts).numpy()
  own_is_best = (np.argmax(q @ corpus.T, axis=1) == np.arange(B)).mean()
  assert own_is_best < 1.0  # so excluding the others changes top-1
  model.hit_rates.reset_states()
  model.compute_loss(LossInputs(acts, features), training=False)
  np.testing.assert_allclose(model.hit_rates.result()[0], own_is_best)
  # Each query's other candidates seen: its own is the only one ranked.
  others = np.array([[j for j in range(B) if j != i] for i in range(B)])
  features[seen_items.SEEN_FEATURE] = others
  assert seen_items.exclusions_of(features) is others
  model.hit_rates.reset_states()
  model.compute_loss(LossInputs(acts, features), training=False)
  np.testing.assert_allclose(model.hit_rates.result()[0], 1.0)
  assert seen_items.exclusions_of({}) is None
