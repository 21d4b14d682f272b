"""Top-k indexes over a candidate corpus: for evaluation and for serving.

`CorpusIndex` keeps the corpus in fixed-size variables (`[V, K]` embeddings
and a `[V]` validity mask, V = the candidate id vocabulary) so re-indexing
after each training phase creates no variables: it works inside
`tf.function`, `strategy.run` and checkpoints, and plugs into
`tfrs.metrics.FactorizedTopK` as its candidate layer. Ids are row numbers.

`make_serving_index` builds TFRS's exported-model index: ScaNN when the
`scann` package is importable, otherwise brute force.
"""

import logging

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from recsys._keras import keras
from recsys.models import layers as model_layers
from recsys.models.errors import ModelConfigError

_MIN_SCORE = float(np.finfo(np.float32).min / 100.0)
_log = logging.getLogger(__name__)


class CorpusIndex(tfrs.layers.factorized_top_k.TopK):
  """Exact (brute-force) top-k over a corpus stored in fixed-size variables.

  Example:
    >>> index = CorpusIndex(num_candidates=23, dim=7, k=5)
    >>> index = index.index(tf.random.normal([23, 7]), tf.range(23))
    >>> scores, ids = index(tf.random.normal([4, 7]))  # [4, 5] each
  """

  def __init__(
    self,
    num_candidates: int,
    dim: int,
    k: int = 100,
    name: str = "corpus_index",
  ) -> None:
    """Creates the (empty) index.

    Args:
      num_candidates: V; candidate ids are in [0, V).
      dim: K, width of candidate embeddings.
      k: default number of results.
      name: Keras name.
    """
    super().__init__(k=k, name=name)
    if num_candidates < 1 or dim < 1:
      raise ModelConfigError(
        "CorpusIndex: num_candidates and dim must be >= 1, got "
        f"{num_candidates}, {dim}."
      )
    self._num_candidates = int(num_candidates)
    self._dim = int(dim)
    # Assignable from a replica context (strategy.run).
    self._embeddings, self._valid = model_layers.candidate_rows(
      self, self._num_candidates, self._dim, "valid"
    )
    self._is_indexed = False

  @property
  def is_indexed(self) -> bool:
    """Whether `index` was called since construction."""
    return self._is_indexed

  def index(
    self, candidates: tf.Tensor, identifiers: tf.Tensor | None = None
  ) -> "CorpusIndex":
    """Replaces the corpus.

    Args:
      candidates: `[N, K]` candidate embeddings.
      identifiers: `[N]` integer ids in [0, V) (default: 0..N-1). A row whose
        id appears twice keeps one of its embeddings.

    Returns:
      self.

    Raises:
      ModelConfigError: wrong embedding width.
      tf.errors.InvalidArgumentError: ids out of range (checked at run time).
    """
    candidates = tf.convert_to_tensor(candidates, tf.float32)
    if candidates.shape.rank != 2 or candidates.shape[-1] != self._dim:
      raise ModelConfigError(
        f"{self.name}: candidate embeddings have shape {candidates.shape}; "
        f"expected [N, {self._dim}]."
      )
    if identifiers is None:
      identifiers = tf.range(tf.shape(candidates)[0])
    ids = tf.reshape(tf.cast(identifiers, tf.int64), [-1])
    checks = [
      tf.debugging.assert_equal(
        tf.shape(ids, out_type=tf.int64)[0],
        tf.shape(candidates, out_type=tf.int64)[0],
        message=f"{self.name}: candidate ids and embeddings differ in length",
      ),
      tf.debugging.assert_non_negative(
        ids, message=f"{self.name}: negative candidate id"
      ),
      tf.debugging.assert_less(
        ids,
        tf.constant(self._num_candidates, tf.int64),
        message=(
          f"{self.name}: candidate id >= vocabulary size {self._num_candidates}"
        ),
      ),
    ]
    with tf.control_dependencies(checks):
      rows = ids[:, tf.newaxis]
      embeddings = tf.scatter_nd(
        rows, candidates, [self._num_candidates, self._dim]
      )
      valid = tf.scatter_nd(
        rows, tf.ones_like(ids, tf.float32), [self._num_candidates]
      )
    self._embeddings.assign(embeddings)
    self._valid.assign(tf.minimum(valid, 1.0))
    self._is_indexed = True
    return self

  def call(
    self, queries: tf.Tensor, k: int | None = None
  ) -> tuple[tf.Tensor, tf.Tensor]:
    """Top-k scores and ids `[Q, min(k, V)]` of each query `[Q, K]`, best first.

    When fewer than k candidates are indexed, the missing results have id -1
    (which matches no true id) and a score of float32.min / 100.
    """
    k = min(k if k is not None else self._k, self._num_candidates)
    valid = self._valid > 0
    scores = tf.matmul(queries, self._embeddings, transpose_b=True)  # [Q, V]
    scores = tf.where(valid[tf.newaxis, :], scores, _MIN_SCORE)
    values, rows = tf.math.top_k(scores, k=k)
    ids = tf.where(
      tf.gather(valid, rows), tf.cast(rows, tf.int64), tf.constant(-1, tf.int64)
    )
    return values, ids

  def query_with_exclusions(
    self, queries: tf.Tensor, exclusions: tf.Tensor, k: int | None = None
  ) -> tuple[tf.Tensor, tf.Tensor]:
    """`call`, each query's `exclusions` left out (e.g. the items it has seen).

    Exact: excluded candidates are masked before the top-k, so each query
    still gets its k best other candidates (TFRS's layers retrieve k + E
    and then drop). Static shapes, so compiled steps can run it.

    Args:
      queries: `[Q, K]`.
      exclusions: int `[Q, E]` candidate ids; -1 (or any id outside
        [0, V)) is padding.
      k: results per query (default: the index's k).

    Returns:
      Top-k scores and ids `[Q, min(k, V)]`, best first.
    """
    k = min(k if k is not None else self._k, self._num_candidates)
    excluded = excluded_mask(exclusions, self._num_candidates)
    valid = tf.logical_and(self._valid[tf.newaxis, :] > 0, ~excluded)
    scores = tf.matmul(queries, self._embeddings, transpose_b=True)
    scores = tf.where(valid, scores, _MIN_SCORE)
    values, rows = tf.math.top_k(scores, k=k)
    ids = tf.where(
      tf.gather(valid, rows, batch_dims=1),
      tf.cast(rows, tf.int64),
      tf.constant(-1, tf.int64),
    )
    return values, ids

  def is_exact(self) -> bool:
    return True

  def corpus(self) -> tuple[tf.Tensor, tf.Tensor]:
    """The indexed ids `[N]` (int64) and embeddings `[N, K]`."""
    ids = tf.reshape(tf.where(self._valid > 0), [-1])
    return ids, tf.gather(self._embeddings, ids)


def excluded_mask(exclusions: tf.Tensor, num_candidates: int) -> tf.Tensor:
  """`[Q, V]` bool: True where row q's `exclusions` `[Q, E]` name the id.

  Ids outside [0, V) (padding: -1) exclude nothing. A scatter, not a
  `[Q, E, V]` comparison, so thousands of seen items cost `[Q, V]` memory.
  """
  exclusions = tf.cast(exclusions, tf.int64)
  queries = tf.shape(exclusions, out_type=tf.int64)[0]
  inside = tf.logical_and(exclusions >= 0, exclusions < num_candidates)
  columns = tf.where(inside, exclusions, num_candidates)  # padding: spare
  rows = tf.broadcast_to(
    tf.range(queries)[:, tf.newaxis], tf.shape(exclusions, out_type=tf.int64)
  )
  index = tf.stack([rows, columns], axis=-1)
  hits = tf.scatter_nd(
    tf.reshape(index, [-1, 2]),
    tf.ones([tf.size(exclusions)], tf.int32),
    tf.stack([queries, tf.constant(num_candidates + 1, tf.int64)]),
  )
  return hits[:, :num_candidates] > 0


def scann_available() -> bool:
  """Whether the `scann` package can be imported."""
  try:
    import scann  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def make_serving_index(
  candidate_embeddings: tf.Tensor,
  candidate_ids: tf.Tensor,
  k: int = 100,
  query_model: keras.Model | None = None,
  use_scann: str = "auto",
) -> tfrs.layers.factorized_top_k.TopK:
  """A TFRS top-k layer over a corpus, for export.

  Args:
    candidate_embeddings: `[N, K]`.
    candidate_ids: `[N]` ids returned by searches.
    k: default number of results.
    query_model: optional model mapping raw query inputs to `[Q, K]`.
    use_scann: "auto" (ScaNN if installed, else brute force with a log line),
      "always" (fail without ScaNN) or "never".

  Returns:
    An indexed `tfrs.layers.factorized_top_k.ScaNN` or `BruteForce`.

  Raises:
    ModelConfigError: unknown `use_scann`, or "always" without ScaNN.
  """
  if use_scann not in ("auto", "always", "never"):
    raise ModelConfigError(
      "make_serving_index: use_scann must be 'auto', 'always' or 'never', "
      f"got {use_scann!r}."
    )
  num = int(candidate_embeddings.shape[0])
  k = min(k, num)
  want_scann = use_scann != "never"
  if want_scann and scann_available():
    index = tfrs.layers.factorized_top_k.ScaNN(
      query_model=query_model,
      k=k,
      num_leaves=max(1, min(1000, int(np.sqrt(num)))),
      num_leaves_to_search=max(1, min(100, int(np.sqrt(num)) // 10)),
    )
  else:
    if use_scann == "always":
      raise ModelConfigError(
        "make_serving_index: use_scann='always' but the 'scann' "
        "package is not installed (pip install scann)."
      )
    if want_scann:
      _log.info(
        "ScaNN is not installed; serving index uses brute force over %d "
        "candidates.",
        num,
      )
    index = tfrs.layers.factorized_top_k.BruteForce(
      query_model=query_model, k=k
    )
  return index.index(candidate_embeddings, candidate_ids)
