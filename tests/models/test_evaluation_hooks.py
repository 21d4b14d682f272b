"""What a model asks of a trainer around evaluation (`evaluation_hooks`):
nothing for a ranking model; the corpus index, evaluation-only hit rates
and top-k names for a retrieval model, its tower compiled once."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys.feature_spec import FeatureSpec
from recsys.models import DLRM, ModelConfigError, TwoTower
from recsys.models.evaluation_hooks import EvaluationContext

SPECS = [FeatureSpec("user", 23), FeatureSpec("item", 29)]
DIMS = {"user": 4, "item": 4}


class Corpus:
  """An eval source's candidates: items 0..n-1 in batches."""

  def __init__(self, n):
    self.n = n

  def candidates(self, batch_size):
    for start in range(0, self.n, batch_size):
      ids = np.arange(start, min(start + batch_size, self.n), dtype=np.int64)
      yield {"categorical": {"item": tf.constant(ids)}}


def _context(compiled, n=11, batch_size=4):
  """A context whose tower compiler records each compilation."""

  def compile_tower(embed, names):
    compiled.append(tuple(names))

    def tower(features):
      rows = tf.shape(features["categorical"]["item"])[0]
      acts = {name: tf.ones([rows, DIMS[name]]) for name in names}
      return embed(acts, features)

    return tower

  return EvaluationContext(None, Corpus(n), batch_size, compile_tower)


def test_a_ranking_model_asks_for_nothing():
  model = DLRM(SPECS, bottom_mlp=(4,), top_mlp=(4,))
  compiled = []
  hooks = model.evaluation_hooks(_context(compiled))
  assert not hooks.ranks_corpus and hooks.ks == ()
  hooks.before_evaluation()
  assert hooks.index_corpus() == 0 and compiled == []
  results = {"train/auc": 0.5, "train/loss": 1.0}
  assert hooks.training_results(results) == results
  assert hooks.batch_transform(exclude_seen=False) is None
  with pytest.raises(ModelConfigError, match="retrieval"):
    hooks.seen_items()


def test_a_retrieval_model_indexes_its_corpus_with_one_compiled_tower():
  model = TwoTower(
    SPECS,
    query_features=["user"],
    candidate_features=["item"],
    query_tower=(4,),
    candidate_tower=(4,),
    ks=(1, 5),
  )
  model.create_variables(DIMS)
  compiled = []
  hooks = model.evaluation_hooks(_context(compiled, n=11, batch_size=4))
  assert hooks.ranks_corpus and hooks.ks == (1, 5)
  assert not model.corpus_index.is_indexed
  hooks.before_evaluation()
  assert model.corpus_index.is_indexed
  assert hooks.index_corpus() == 11  # 3 batches: 4 + 4 + 3
  assert compiled == [("item",)]  # once per run, not per evaluation
  ids, _ = model.corpus_index.corpus()
  assert sorted(np.asarray(ids).tolist()) == list(range(11))
  # Corpus hit rates mean something in evaluation only.
  results = {"train/hit_rate_top1": 0.1, "train/loss": 1.0}
  assert hooks.training_results(results) == {"train/loss": 1.0}
  assert hooks.batch_transform(exclude_seen=False) is None
