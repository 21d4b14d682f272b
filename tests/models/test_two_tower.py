"""Tests of the two-tower retrieval model, its corpus index and the retrieval metrics."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec
from recsys.models import (
  CorpusIndex,
  FeatureMismatchError,
  LossInputs,
  ModelConfigError,
  TwoTower,
  hit_rates,
  make_serving_index,
  popularity_hit_rates,
  scann_available,
)
from recsys.models.base import replica_loss
from tests.models import reference

B = 5
SPECS = [
  FeatureSpec("user", 23),
  FeatureSpec("age", 7),
  FeatureSpec("item", 29),
  FeatureSpec("genres", 11, multi_hot=True, max_ids=3, weighted=True),
]
DIMS = {"user": 7, "age": 11, "item": 7, "genres": 11}


def _model(**kwargs):
  kwargs = dict(
    dict(
      query_features=["user", "age"],
      candidate_features=["item", "genres"],
      query_tower=(13, 7),
      candidate_tower=(7,),
    ),
    **kwargs,
  )
  return TwoTower(SPECS, **kwargs)


def _batch(batch=B, seed=0, item_ids=None):
  rng = np.random.default_rng(seed)
  acts = {
    name: rng.normal(size=(batch, d)).astype(np.float32)
    for name, d in DIMS.items()
  }
  ids = rng.integers(0, 29, batch) if item_ids is None else np.asarray(item_ids)
  features = {
    "categorical": {"item": ids.astype(np.int64)},
    "candidate_sampling_probability": rng.uniform(0.01, 0.5, batch).astype(
      np.float32
    ),
  }
  return acts, features


def test_tower_shapes_and_normalization():
  model = _model(num_dense=3)
  acts, features = _batch()
  features["dense"] = np.ones([B, 3], np.float32)
  q = model.query_embeddings(acts, features).numpy()
  c = model.candidate_embeddings(acts, features).numpy()
  assert q.shape == c.shape == (B, 7)
  np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)
  assert model.query_tower.layers[0].weights[0].shape == (3 + 7 + 11, 13)
  np.testing.assert_allclose(
    model(acts, features).numpy(), np.sum(q * c, 1), rtol=1e-5
  )
  raw = _model(normalize=False)
  acts, features = _batch()
  assert not np.allclose(
    np.linalg.norm(raw.query_embeddings(acts).numpy(), axis=1), 1.0
  )


@pytest.mark.parametrize("temperature", [None, 0.2])
@pytest.mark.parametrize("logq", [False, True, 0.5, 1.5])
@pytest.mark.parametrize("remove_hits", [False, True])
def test_in_batch_softmax_loss_matches_numpy(temperature, logq, remove_hits):
  model = _model(
    temperature=temperature,
    logq_correction=logq,
    remove_accidental_hits=remove_hits,
  )
  acts, features = _batch(
    item_ids=[3, 7, 3, 1, 3]
  )  # accidental hits for rows 0, 2, 4
  q = model.query_embeddings(acts).numpy()
  c = model.candidate_embeddings(acts).numpy()
  expected = reference.in_batch_softmax_loss(
    q,
    c,
    ids=features["categorical"]["item"] if remove_hits else None,
    temperature=temperature,
    sampling_probability=features["candidate_sampling_probability"]
    if logq
    else None,
    logq_weight=float(logq),
  )
  loss = replica_loss(
    model, model.per_example_loss(LossInputs(acts, features)), 4 * B
  ).numpy()
  np.testing.assert_allclose(loss, expected.sum() / (4 * B), rtol=1e-5)


@pytest.mark.parametrize("strength", [-0.5, float("nan"), "yes"])
def test_logq_strength_must_be_a_non_negative_number(strength):
  with pytest.raises(SettingsError, match="logq_correction must be"):
    _model(logq_correction=strength)


def test_logq_needs_sampling_probability():
  model = _model(logq_correction=True)
  acts, features = _batch()
  del features["candidate_sampling_probability"]
  with pytest.raises(
    FeatureMismatchError, match="candidate_sampling_probability"
  ):
    model.compute_loss(LossInputs(acts, features))


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (
      dict(candidate_tower=(8,)),
      "query_tower ends in 7 but candidate_tower ends in 8",
    ),
    (dict(query_tower=()), "need at least one layer each"),
    (
      dict(query_features=["user", "zip"]),
      r"query_features \['zip'\] are not in feature_specs",
    ),
    (dict(candidate_features=[]), "candidate_features is empty"),
    (dict(candidate_id_feature="genres"), "'genres' must be one-hot"),
    (
      dict(candidate_id_feature="user"),
      "'user' is not one of the candidate_features",
    ),
    (dict(temperature=0.0), "temperature must be > 0"),
  ],
)
def test_config_errors(kwargs, message):
  with pytest.raises(SettingsError, match=message):
    _model(**kwargs)


def test_missing_tower_feature():
  model = _model()
  acts, features = _batch()
  del acts["genres"]
  with pytest.raises(FeatureMismatchError, match=r"Missing: \['genres'\]"):
    model.candidate_embeddings(acts)


def test_corpus_hit_rates_match_numpy_brute_force():
  model = _model(ks=(1, 3, 10, 50))
  acts, features = _batch(batch=17, seed=3)
  with pytest.raises(RuntimeError, match="index_candidates"):
    model.compute_loss(LossInputs(acts, features), training=False)
  rng = np.random.default_rng(4)
  corpus_ids = np.array(
    [i for i in range(29) if i % 4 != 1]
  )  # some items not in the corpus
  corpus = rng.normal(size=(len(corpus_ids), 7)).astype(np.float32)
  model.index_candidates(corpus_ids, corpus)
  model.compute_loss(LossInputs(acts, features), training=False)
  q = model.query_embeddings(acts).numpy()
  true_ids = features["categorical"]["item"]
  expected = reference.top_k_hits(
    q, corpus, corpus_ids, true_ids, (1, 3, 10, 50)
  )
  results = {m.name: m.result().numpy() for m in model.metrics}
  for k in (1, 3, 10, 50):
    np.testing.assert_allclose(
      results[f"hit_rate/top_{k}_categorical_accuracy"], expected[k], atol=1e-6
    )
  helper = model.evaluate_retrieval(q, corpus, corpus_ids, true_ids)
  assert helper == {
    f"top_{k}_hit_rate": pytest.approx(expected[k]) for k in (1, 3, 10, 50)
  }


def test_corpus_hit_rates_with_replicas(strategy):
  with strategy.scope():
    model = _model(ks=(1, 5))
    model.create_variables(DIMS)
  rng = np.random.default_rng(5)
  corpus = rng.normal(size=(29, 7)).astype(np.float32)
  model.index_candidates(np.arange(29), corpus)
  n = strategy.num_replicas_in_sync
  acts, features = _batch(batch=4 * n, seed=6)
  per_replica = 4

  def shard(ctx):
    rows = slice(
      ctx.replica_id_in_sync_group * per_replica,
      (ctx.replica_id_in_sync_group + 1) * per_replica,
    )
    return (
      {k: v[rows] for k, v in acts.items()},
      {"categorical": {"item": features["categorical"]["item"][rows]}},
    )

  @tf.function
  def step(inputs):
    return strategy.run(
      lambda a, f: model.compute_loss(LossInputs(a, f), training=False),
      args=inputs,
    )

  step(strategy.experimental_distribute_values_from_function(shard))
  q = model.query_embeddings(acts).numpy()
  expected = reference.top_k_hits(
    q, corpus, np.arange(29), features["categorical"]["item"], (1, 5)
  )
  results = {m.name: m.result().numpy() for m in model.metrics}
  np.testing.assert_allclose(
    results["hit_rate/top_1_categorical_accuracy"], expected[1], atol=1e-6
  )
  np.testing.assert_allclose(
    results["hit_rate/top_5_categorical_accuracy"], expected[5], atol=1e-6
  )


@pytest.mark.parametrize("query_batch_size", [3, 1024])
def test_hit_rates_helper_matches_numpy(query_batch_size):
  rng = np.random.default_rng(8)
  q = rng.normal(size=(13, 7)).astype(np.float32)
  corpus = rng.normal(size=(23, 7)).astype(np.float32)
  ids = rng.permutation(100)[:23]
  true_ids = np.concatenate(
    [ids[rng.integers(0, 23, 12)], [1000]]
  )  # one id not in the corpus
  got = hit_rates(
    q,
    corpus,
    ids,
    true_ids,
    ks=(1, 5, 10, 50),
    query_batch_size=query_batch_size,
  )
  expected = reference.top_k_hits(q, corpus, ids, true_ids, (1, 5, 10, 50))
  assert got == {
    f"top_{k}_hit_rate": pytest.approx(v) for k, v in expected.items()
  }
  assert got["top_50_hit_rate"] == pytest.approx(12 / 13)


def test_popularity_hit_rates():
  train = [
    5,
    5,
    5,
    2,
    2,
    9,
    1,
    1,
    1,
    1,
    7,
    7,
  ]  # ranking by count, ties by id: 1, 5, 2, 7, 9
  rates = popularity_hit_rates(train, [1, 2, 9, 7], ks=(1, 2, 3, 4, 5))
  assert rates == {
    "top_1_hit_rate": 0.25,
    "top_2_hit_rate": 0.25,
    "top_3_hit_rate": 0.5,
    "top_4_hit_rate": 0.75,
    "top_5_hit_rate": 1.0,
  }


def test_corpus_index_errors_and_exclusion():
  index = CorpusIndex(num_candidates=23, dim=7, k=5)
  with pytest.raises(ModelConfigError, match=r"expected \[N, 7\]"):
    index.index(tf.zeros([3, 11]), tf.range(3))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="vocabulary size 23"
  ):
    index.index(tf.zeros([2, 7]), tf.constant([3, 23]))
  embeddings = np.random.default_rng(9).normal(size=(4, 7)).astype(np.float32)
  index.index(embeddings, tf.constant([2, 4, 8, 16]))
  _, ids = index(
    tf.constant(embeddings), k=10
  )  # only 4 rows indexed: 4 results, then -1
  assert set(ids.numpy()[:, :4].ravel()) == {2, 4, 8, 16}
  assert (ids.numpy()[:, 4:] == -1).all()
  got_ids, got_embeddings = index.corpus()
  np.testing.assert_array_equal(got_ids.numpy(), [2, 4, 8, 16])
  np.testing.assert_allclose(got_embeddings.numpy(), embeddings)


def test_serving_index_brute_force():
  rng = np.random.default_rng(10)
  corpus = rng.normal(size=(23, 7)).astype(np.float32)
  ids = np.arange(100, 123)
  queries = rng.normal(size=(4, 7)).astype(np.float32)
  index = make_serving_index(corpus, ids, k=5, use_scann="never")
  assert isinstance(index, tfrs.layers.factorized_top_k.BruteForce)
  _, top = index(queries)
  np.testing.assert_array_equal(
    top.numpy(), ids[np.argsort(-(queries @ corpus.T), 1)[:, :5]]
  )
  if not scann_available():
    with pytest.raises(ModelConfigError, match="scann"):
      make_serving_index(corpus, ids, use_scann="always")
  model = _model()
  model.index_candidates(
    np.arange(29), rng.normal(size=(29, 7)).astype(np.float32)
  )
  _, top = model.serving_index(k=3)(queries)
  assert top.shape == (4, 3)


@pytest.mark.slow
def test_two_tower_learns_planted_preferences():
  """A two-tower model with tables made here beats the popularity baseline by far.

  Planted: 97 users and 61 items with 4-dim factors; user u picks item i with
  probability softmax_i(3 <x_u, y_i> + pop_i), pop_i a Zipf-like log-popularity.
  Top-10 hit rates on 4000 held-out pairs, measured: popularity 0.65, the
  model after 400 steps of in-batch softmax with log-Q correction 0.88, Bayes
  (ranking by the true probabilities) 0.91. The popularity baseline knows
  pop_i exactly, so beating it by 0.15 (two thirds of the measured gap, and
  over half of the room up to Bayes) shows the personal term is learned.
  """
  rng = np.random.default_rng(0)
  num_users, num_items, dim = 97, 61, 8
  x = rng.normal(size=(num_users, 4))
  y = rng.normal(size=(num_items, 4))
  log_pop = -1.0 * np.log1p(np.arange(num_items))
  logits = 3.0 * x @ y.T / 2.0 + log_pop
  probs = np.exp(logits - logits.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  item_marginal = probs.mean(0)

  def sample(n):
    users = rng.integers(0, num_users, n)
    items = np.array([rng.choice(num_items, p=probs[u]) for u in users])
    return users, items

  specs = [FeatureSpec("user", num_users), FeatureSpec("item", num_items)]
  tf.keras.utils.set_random_seed(0)
  model = TwoTower(
    specs,
    ["user"],
    ["item"],
    query_tower=(32, 16),
    candidate_tower=(32, 16),
    temperature=0.1,
    logq_correction=True,
  )
  tables = {
    "user": tf.Variable(tf.random.normal([num_users, dim], stddev=0.1, seed=1)),
    "item": tf.Variable(tf.random.normal([num_items, dim], stddev=0.1, seed=2)),
  }
  model.create_variables({"user": dim, "item": dim})
  optimizer = tf.keras.optimizers.Adam(0.01)
  variables = model.trainable_variables + list(tables.values())

  @tf.function
  def train_step(users, items, p):
    with tf.GradientTape() as tape:
      acts = {
        "user": tf.gather(tables["user"], users),
        "item": tf.gather(tables["item"], items),
      }
      features = {
        "categorical": {"item": items},
        "candidate_sampling_probability": p,
      }
      loss = model.compute_loss(LossInputs(acts, features))
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  train_items = []
  for _ in range(400):
    users, items = sample(128)
    train_items.append(items)
    train_step(users, items, item_marginal[items].astype(np.float32))
  corpus = model.candidate_embeddings(
    {"item": tf.gather(tables["item"], np.arange(num_items))}
  )
  users, items = sample(4000)
  q = model.query_embeddings({"user": tf.gather(tables["user"], users)})
  learned = hit_rates(q, corpus, np.arange(num_items), items, ks=(10,))[
    "top_10_hit_rate"
  ]
  popular = popularity_hit_rates(np.concatenate(train_items), items, ks=(10,))[
    "top_10_hit_rate"
  ]
  bayes = reference.top_k_hits(
    np.eye(num_users)[users],
    np.log(probs).T,
    np.arange(num_items),
    items,
    (10,),
  )[10]
  assert learned > popular + 0.15, (learned, popular, bayes)
