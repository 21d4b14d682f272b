"""Seen-item exclusion: the table, the index, the hit rates and evaluation.

References are NumPy: each query's training items as Python sets, scores
masked by hand, ranks counted by hand.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

from recsys.data import SyntheticRetrieval
from recsys.features import EmbeddingSettings
from recsys.models import (
  DLRM,
  CorpusIndex,
  ModelConfigError,
  TwoTower,
  hit_rates,
  make_serving_index,
  popularity_hit_rates,
)
from recsys.models.loss_inputs import LossInputs
from recsys.models.retrieval.seen_items import SEEN_FEATURE, SeenItems
from recsys.training import Trainer, TrainerConfigError
from tests.training.test_trainer import embedding


def _pairs(seed=0, users=13, items=23, n=90):
  rng = np.random.default_rng(seed)
  return rng.integers(0, users, n), rng.integers(0, items, n)


def _sets(users, items):
  seen = {}
  for u, i in zip(users, items):
    seen.setdefault(int(u), set()).add(int(i))
  return seen


def test_seen_items_are_each_users_training_items_minus_the_positive():
  users, items = _pairs()
  seen = SeenItems.from_pairs(users, items, num_queries=15)
  want = _sets(users, items)
  queries = np.array([0, 3, 3, 14, 12, 99, -1])  # 14: no pair; 99, -1: none
  positives = np.array([-5, items[users == 3][0], 0, 1, 2, 3, 4])
  got = seen.lookup(queries, positives).to_list()
  for q, p, row in zip(queries, positives, got):
    expected = want.get(int(q), set()) - {int(p)}
    assert sorted(row) == sorted(expected), q
    assert len(row) == len(set(row))  # a pair seen twice is listed once
  padded = seen.padded(queries).numpy()
  assert padded.shape == (7, seen.max_seen)
  for q, row in zip(queries, padded):
    assert set(row[row >= 0]) == want.get(int(q), set())


def test_index_query_with_exclusions_masks_exactly():
  rng = np.random.default_rng(1)
  corpus, queries = rng.normal(size=(11, 5)), rng.normal(size=(4, 5))
  index = CorpusIndex(num_candidates=13, dim=5, k=6)
  index.index(tf.constant(corpus, tf.float32), tf.range(11))
  exclusions = np.array([[0, 3, -1], [10, 10, 12], [-1, -1, -1], [1, 2, 4]])
  scores, ids = index.query_with_exclusions(
    tf.constant(queries, tf.float32), tf.constant(exclusions)
  )
  for row in range(4):
    s = queries[row] @ corpus.T
    s[[e for e in exclusions[row] if 0 <= e < 11]] = -np.inf
    want = np.argsort(-s, kind="stable")[:6]
    np.testing.assert_array_equal(ids[row], want)
    np.testing.assert_allclose(scores[row], s[want], rtol=1e-5)
  # More exclusions than candidates left: the missing results are id -1.
  _, ids = index.query_with_exclusions(
    tf.constant(queries[:1], tf.float32),
    tf.constant([list(range(8))]),
    k=5,
  )
  np.testing.assert_array_equal(ids[0, 3:], [-1, -1])


def test_tfrs_serving_index_takes_the_same_exclusions():
  """`make_serving_index` (TFRS's BruteForce here) with TFRS's
  `query_with_exclusions` and `SeenItems.padded`: the exact top k of the
  unseen candidates, as `CorpusIndex` ranks them."""
  rng = np.random.default_rng(4)
  corpus, queries = rng.normal(size=(30, 5)), rng.normal(size=(6, 5))
  users, items = _pairs(5, users=6, items=30, n=40)
  seen = SeenItems.from_pairs(users, items, 6)
  exclusions = seen.padded(np.arange(6))
  serving = make_serving_index(
    tf.constant(corpus, tf.float32),
    tf.range(30, dtype=tf.int64),  # the ids `model.serving_index` passes
    k=8,
    use_scann="never",
  )
  _, got = serving.query_with_exclusions(
    tf.constant(queries, tf.float32), exclusions
  )
  index = CorpusIndex(num_candidates=30, dim=5, k=8)
  index.index(tf.constant(corpus, tf.float32), tf.range(30))
  _, want = index.query_with_exclusions(
    tf.constant(queries, tf.float32), exclusions
  )
  np.testing.assert_array_equal(got, want)
  for row in range(6):
    assert not set(got[row].numpy()) & set(items[users == row])


def _numpy_hit_rates(q, c, cids, true, seen, ks):
  out = {k: 0 for k in ks}
  for row in range(len(q)):
    s = q[row] @ c.T
    excluded = [j for j, cid in enumerate(cids) if cid in seen[row]]
    excluded = [j for j in excluded if cids[j] != true[row]]
    s[excluded] = -np.inf
    rank = np.argsort(-s, kind="stable")
    for k in ks:
      out[k] += true[row] in cids[rank[:k]]
  return {f"top_{k}_hit_rate": v / len(q) for k, v in out.items()}


def test_hit_rates_with_exclusions_match_numpy():
  rng = np.random.default_rng(2)
  q, c = rng.normal(size=(40, 6)), rng.normal(size=(17, 6))
  cids = rng.permutation(30)[:17]  # ids are not row numbers
  true = rng.choice(cids, 40)
  users, items = _pairs(3, users=40, items=30, n=400)
  seen = SeenItems.from_pairs(users, items, 40)
  exclusions = seen.lookup(np.arange(40))  # the true id stays (never masked)
  sets = [set(r) for r in exclusions.to_list()]
  got = hit_rates(q, c, cids, true, (1, 3, 10), 7, exclusions=exclusions)
  want = _numpy_hit_rates(q, c, cids, true, sets, (1, 3, 10))
  assert got == pytest.approx(want)
  assert got != hit_rates(q, c, cids, true, (1, 3, 10))  # it matters


def test_popularity_with_exclusions_is_the_most_popular_unseen():
  train = np.array([5, 5, 5, 2, 2, 7, 7, 9, 1])
  true = np.array([2, 9, 1])
  exclusions = tf.ragged.constant([[5], [5, 2, 7], []], tf.int64)
  got = popularity_hit_rates(train, true, (1, 2), exclusions=exclusions)
  # Ties go to the smaller id. Row 0 ranks 2, 7, 1, 9 (a top-1 hit); row
  # 1 only 1, 9 (a top-2 hit); row 2 everything: 5, 2, 7, 1, 9 (a miss).
  assert got == {"top_1_hit_rate": 1 / 3, "top_2_hit_rate": 2 / 3}
  kept = popularity_hit_rates(train, true, (1, 2))
  assert kept == {"top_1_hit_rate": 0.0, "top_2_hit_rate": 1 / 3}


def _trainer(model_dir, **kwargs):
  source = SyntheticRetrieval(
    num_users=31, num_items=29, num_examples=600, num_eval_examples=70
  )
  return Trainer(
    str(model_dir),
    source,
    functools.partial(TwoTower, query_tower=(7,), candidate_tower=(7,)),
    embedding=EmbeddingSettings(dim=5),
    embedding_optimizer=embedding.Adagrad(0.2),
    global_batch_size=30,
    eval_batch_size=20,  # 70 = 3 whole batches + a padded one
    train_steps=20,
    steps_per_loop=10,
    eval_steps=None,
    progress_bar=False,
    summaries=False,
    **kwargs,
  )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A two-tower trained a few steps on a finite synthetic split."""
  trainer = _trainer(tmp_path_factory.mktemp("run"))
  trainer.train()
  return trainer


def _eval_arrays(trainer):
  q_embed, users, items = [], [], []
  model, source = trainer.model, trainer.run.eval_source
  from recsys.run import restored as restored_lib  # noqa: PLC0415

  embed = restored_lib.embed_fn(
    trainer.backend, model.query_embeddings, model.query_features
  )
  for features, _ in source.dataset(
    25, training=False, repeat=False, drop_remainder=False
  ):
    q_embed.append(embed(features).numpy())
    users.append(features["categorical"]["user_id"].numpy())
    items.append(features["categorical"]["item_id"].numpy())
  return np.concatenate(q_embed), np.concatenate(users), np.concatenate(items)


def test_evaluation_excludes_each_users_training_items(trained):
  kept = trained.evaluate()
  excluded = trained.evaluate(exclude_seen=True)
  assert (
    excluded["eval/exclude_seen"] == 1.0 and "eval/exclude_seen" not in kept
  )
  assert excluded["eval/examples"] == kept["eval/examples"] == 70
  # The reference: the model's embeddings, ranked in NumPy without each
  # eval pair's user's training items (read from the training split).
  q, users, items = _eval_arrays(trained)
  cids, c = (t.numpy() for t in trained.model.corpus_index.corpus())
  train_users, train_items = [], []
  for features, _ in trained.run.source.dataset(
    100, training=True, repeat=False, drop_remainder=False
  ):
    train_users.append(features["categorical"]["user_id"].numpy())
    train_items.append(features["categorical"]["item_id"].numpy())
  sets = _sets(np.concatenate(train_users), np.concatenate(train_items))
  seen = [sets.get(int(u), set()) for u in users]
  ks = trained.model.ks
  for exclude, got in ((False, kept), (True, excluded)):
    want = _numpy_hit_rates(
      q, c, cids, items, seen if exclude else [set()] * len(q), ks
    )
    for k in ks:
      np.testing.assert_allclose(
        got[f"eval/hit_rate/top_{k}_categorical_accuracy"],
        want[f"top_{k}_hit_rate"],
        atol=1e-6,
        err_msg=f"exclude_seen={exclude} top {k}",
      )
  assert (
    excluded["eval/hit_rate/top_5_categorical_accuracy"]
    != (kept["eval/hit_rate/top_5_categorical_accuracy"])
  )


def test_compiled_evaluation_excludes_the_same_items(trained):
  """The eval step compiled with XLA (as on a TPU): the same hit rates."""
  compiled = _trainer(trained.run.model_dir, jit_compile=True)
  assert compiled.run.restored_step == 20 and compiled.steps.jit_compile
  want = trained.evaluate(exclude_seen=True)
  got = compiled.evaluate(exclude_seen=True)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-5, err_msg=key)


def test_model_metric_reads_the_seen_feature(trained):
  """`compute_loss` on a batch with `features[SEEN_FEATURE]` (the contract
  evaluation uses): the positive is never excluded, even when listed."""
  model = trained.model
  features, _ = next(
    iter(trained.run.eval_source.dataset(10, training=False, repeat=False))
  )
  from recsys.serving.lookup import serving_activations  # noqa: PLC0415

  acts = serving_activations(
    trained.backend, features, list(trained.run.feature_config)
  )
  features = dict(features)
  # Everything excluded but the positive: every query hits at top 1.
  every = tf.tile(tf.range(29, dtype=tf.int64)[tf.newaxis, :], [10, 1])
  features[SEEN_FEATURE] = every
  model.hit_rates.reset_states()
  model.compute_loss(LossInputs(acts, features), training=False)
  top_1 = model.hit_rates.result()[0]  # one rate per k, ks ascending
  assert float(top_1) == 1.0


def test_endless_training_split_and_ranking_models_are_refused(tmp_path):
  with pytest.raises(ModelConfigError, match="endless"):
    SeenItems.from_source(SyntheticRetrieval(num_users=5, num_items=4))
  with pytest.raises(TrainerConfigError, match="ranking model"):
    from tests.training.sources import ArraySource  # noqa: PLC0415

    Trainer(
      str(tmp_path),
      ArraySource(),
      functools.partial(DLRM, bottom_mlp=(4,), top_mlp=(4,)),
      embedding=EmbeddingSettings(dim=4),
      global_batch_size=10,
      progress_bar=False,
      exclude_seen=True,
    )
