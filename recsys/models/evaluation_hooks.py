"""What a trainer does around a model's evaluation, as the model says.

A ranking model scores the pairs it is given: its evaluation needs nothing
more (`EvaluationHooks`, the default). A retrieval model ranks a whole
candidate corpus (`CorpusEvaluation`): before each evaluation the corpus is
embedded into its index, its corpus hit rates mean something in evaluation
only, their values are named by the top-k cut-offs, and an evaluation may
leave out the candidates each user saw in training (`exclude_seen`). A
model gives its hooks with `model.evaluation_hooks(context)`, so the
trainer calls them and never asks which kind of model it runs.

Example:
  >>> hooks = model.evaluation_hooks(EvaluationContext(
  ...   source, eval_source, batch_size=512,
  ...   compile_tower=functools.partial(restored.embed_fn, backend)))
  >>> hooks.before_evaluation()   # a retrieval model indexes its corpus
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from recsys.models.errors import ModelConfigError
from recsys.models.retrieval import seen_items as seen_lib

#: Features -> features: what evaluation adds to each batch before the
#: backend's preprocessing (e.g. the seen candidates).
BatchTransform = Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class EvaluationContext:
  """What of the run a model's evaluation hooks use (given by the trainer).

  Attributes:
    source: the training source (its training split: what users saw).
    eval_source: the evaluation source (its `candidates`: the corpus).
    batch_size: examples per batch when embedding the corpus.
    compile_tower: `(embed, feature_names) -> (features -> [B, K])`, a
      compiled lookup of `feature_names` in the run's tables followed by
      `embed` (`recsys.run.restored.embed_fn` on the run's backend).
  """

  source: Any
  eval_source: Any
  batch_size: int
  compile_tower: Callable[[Callable[..., tf.Tensor], Sequence[str]], Any]


class EvaluationHooks:
  """A ranking model's hooks: its evaluation scores the batches as given."""

  #: Whether evaluation ranks a candidate corpus (retrieval; then
  #: `exclude_seen` applies).
  ranks_corpus = False

  #: The top-k cut-offs that name a metric's values (`hit_rate_top10`).
  ks: tuple[int, ...] = ()

  def before_evaluation(self) -> None:
    """Prepares the model for an evaluation (a ranking model: nothing)."""

  def index_corpus(self) -> int:
    """Indexes the candidate corpus; returns its size (0: no corpus)."""
    return 0

  def training_results(self, results: Mapping[str, float]) -> dict[str, float]:
    """The training metrics that mean something in training: all here."""
    return dict(results)

  def batch_transform(self, exclude_seen: bool) -> BatchTransform | None:
    """What evaluation adds to each batch (None: nothing)."""
    del exclude_seen
    return None

  def seen_items(self) -> seen_lib.SeenItems:
    """Each user's training candidates: a retrieval model's only."""
    raise ModelConfigError(
      "seen items belong to retrieval models; a ranking model ranks no corpus."
    )


class CorpusEvaluation(EvaluationHooks):
  """A retrieval model's hooks: evaluation ranks the whole candidate corpus.

  Args:
    model: the `RetrievalModel`.
    context: the run's sources and its tower compiler.

  The compiled candidate tower is made once and kept, so every evaluation
  of the run reuses its traces; what each user saw is read from the
  training split once, when an evaluation first excludes it.
  """

  ranks_corpus = True

  def __init__(self, model: Any, context: EvaluationContext):
    self.model = model
    self.context = context
    self.ks = tuple(model.ks)
    self.embed_candidates: Any = None  # compiled on the first indexing
    self._seen_items: seen_lib.SeenItems | None = None

  def before_evaluation(self) -> None:
    """Embeds the corpus into the model's index (hit rates rank it)."""
    self.index_corpus()

  def index_corpus(self) -> int:
    """Embeds the whole candidate corpus into the model's index.

    Returns:
      The number of candidates indexed.
    """
    model = self.model
    if self.embed_candidates is None:
      # One function for every evaluation of the run: a new one each time
      # traced again at every evaluation (TF then warns of retracing).
      self.embed_candidates = self.context.compile_tower(
        model.candidate_embeddings, model.candidate_features
      )
    ids, embeddings = [], []
    for batch in self.context.eval_source.candidates(self.context.batch_size):
      embeddings.append(self.embed_candidates(batch))
      ids.append(model.candidate_ids(batch))
    all_ids = tf.concat(ids, 0)
    model.index_candidates(all_ids, tf.concat(embeddings, 0))
    return int(all_ids.shape[0])

  def training_results(self, results: Mapping[str, float]) -> dict[str, float]:
    """Without the corpus hit rates: they are computed in evaluation only."""
    return {k: v for k, v in results.items() if "hit_rate" not in k}

  def batch_transform(self, exclude_seen: bool) -> BatchTransform | None:
    """With `exclude_seen`: each batch carries its users' seen candidates
    (`seen_items.with_seen`), which the hit rates leave out."""
    if not exclude_seen:
      return None
    return functools.partial(
      seen_lib.with_seen,
      seen=self.seen_items(),
      query_id_feature=seen_lib.query_id_feature_of(self.context.source),
      candidate_id_feature=self.model.candidate_id_feature,
    )

  def seen_items(self) -> seen_lib.SeenItems:
    """Each user's candidates in the training split (read once, then kept)."""
    if self._seen_items is None:
      self._seen_items = seen_lib.SeenItems.from_source(self.context.source)
    return self._seen_items
