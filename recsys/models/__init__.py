"""Ranking and retrieval models over embedding activations: DLRM, DCN, 2-tower.

Models never create embedding tables nor touch `tf.tpu` or strategies: they
take the backend's activations (dict feature name -> `[B, D]` / `[B, L, D]`)
plus the batch's features and return predictions or a loss (see
`recsys.models.base` for the per-replica loss convention).

Example (inside `strategy.run`, with `acts = backend.lookup(...)` under a tape):

  model = DLRM(source.feature_specs, num_dense=source.num_dense,
               bottom_mlp=(64, 16))
  model.create_variables({"user": 16, "item": 16})      # in strategy.scope()
  per_example = model.per_example_loss(LossInputs(acts, features, labels))
  loss = base.replica_loss(model, per_example, global_batch_size=1024)

For `compile` + `fit` on your own `tf.data.Dataset`, wrap a model with its
embedding layer: `KerasRecommender.build(DLRM, feature_config, Adagrad(0.05))`.
"""

from recsys.models.base import RankingModel
from recsys.models.dcn import DCNv2
from recsys.models.dlrm import DLRM
from recsys.models.errors import (
  EmbeddingDimError,
  FeatureMismatchError,
  ModelConfigError,
)
from recsys.models.fm import FactorizationMachine
from recsys.models.keras_model import KerasRecommender
from recsys.models.loss_inputs import LossInputs
from recsys.models.retrieval.index import (
  CorpusIndex,
  make_serving_index,
  scann_available,
)
from recsys.models.retrieval.metrics import hit_rates, popularity_hit_rates
from recsys.models.retrieval.model import RetrievalModel
from recsys.models.retrieval.two_tower import TwoTower

__all__ = [
  "CorpusIndex",
  "DCNv2",
  "DLRM",
  "EmbeddingDimError",
  "FactorizationMachine",
  "FeatureMismatchError",
  "KerasRecommender",
  "LossInputs",
  "ModelConfigError",
  "RankingModel",
  "RetrievalModel",
  "TwoTower",
  "hit_rates",
  "make_serving_index",
  "popularity_hit_rates",
  "scann_available",
]
