"""Retrieval quality: corpus hit rates, popularity baseline, the eval metric.

`hit_rates` and `popularity_hit_rates` return `{"top_{k}_hit_rate": float}`
for each k: the fraction of held-out (query, true candidate) pairs whose
true candidate is among the k best-scoring candidates of the whole corpus
(brute force, exact) or among the k most popular candidates of the
training interactions. With `exclusions` (each user's training items,
`seen_items`) a query ranks only the other candidates: the
"seen items excluded" protocol. `CorpusHitRates` is the metric evaluation
updates (TFRS's `FactorizedTopK`, with the same exclusions).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from recsys.models.errors import ModelConfigError
from recsys.models.retrieval import index as retrieval_index


class CorpusHitRates(tfrs.metrics.FactorizedTopK):
  """`FactorizedTopK` over a `CorpusIndex`, optionally without seen items.

  `update_state(..., exclusions=...)` ranks each query's candidates
  without the ids its row of `exclusions` names (`[B, E]`, -1 padded; the
  items the user saw in training), exactly (`CorpusIndex.
  query_with_exclusions`). The true candidate is never excluded, even if
  `exclusions` names it. Without exclusions it is `FactorizedTopK`.
  """

  def update_state(
    self,
    query_embeddings: tf.Tensor,
    true_candidate_embeddings: tf.Tensor,
    true_candidate_ids: tf.Tensor | None = None,
    sample_weight: tf.Tensor | None = None,
    exclusions: tf.Tensor | None = None,
  ):
    if exclusions is None:
      return super().update_state(
        query_embeddings,
        true_candidate_embeddings,
        true_candidate_ids,
        sample_weight,
      )
    if true_candidate_ids is None:
      raise ModelConfigError(
        "CorpusHitRates: excluding seen candidates needs the true "
        "candidate ids (id-based evaluation)."
      )
    true = tf.reshape(tf.cast(true_candidate_ids, tf.int64), [-1, 1])
    exclusions = tf.cast(exclusions, tf.int64)
    exclusions = tf.where(
      tf.equal(exclusions, true), tf.constant(-1, tf.int64), exclusions
    )
    _, retrieved = self._candidates.query_with_exclusions(
      query_embeddings, exclusions, k=max(self._ks)
    )
    match = tf.cast(tf.equal(retrieved, true), tf.float32)
    updates = []
    for k, metric in zip(self._ks, self._top_k_metrics):
      found = tf.minimum(tf.reduce_sum(match[:, :k], axis=1, keepdims=True), 1)
      updates.append(metric.update_state(found, sample_weight))
    return tf.group(updates)


def _key(k: int) -> str:
  return f"top_{k}_hit_rate"


def _check_ks(ks: Sequence[int]) -> tuple:
  ks = tuple(sorted(set(int(k) for k in ks)))
  if not ks or ks[0] < 1:
    raise ModelConfigError(f"ks must be positive integers, got {ks}.")
  return ks


def hit_rates(
  query_embeddings: tf.Tensor,
  candidate_embeddings: tf.Tensor,
  candidate_ids: tf.Tensor,
  true_ids: tf.Tensor,
  ks: Sequence[int] = (1, 5, 10, 50, 100),
  query_batch_size: int = 1024,
  exclusions: Any = None,
) -> dict[str, float]:
  """Top-k hit rates of queries against the whole corpus, by brute force.

  Args:
    query_embeddings: `[Q, K]`.
    candidate_embeddings: `[N, K]`, the whole corpus.
    candidate_ids: `[N]` id of each corpus row (>= 0).
    true_ids: `[Q]` id of each query's held-out candidate.
    ks: cut-offs; a k above N counts all of the corpus.
    query_batch_size: queries scored at once (memory: `[batch, N]` floats).
    exclusions: candidate ids each query does not rank (e.g. its user's
      training items, `SeenItems.lookup`): `[Q, None]` ragged or `[Q, E]`
      padded with -1; a query's true id is never excluded. None: none.

  Returns:
    `{"top_{k}_hit_rate": fraction}` for each k.

  Raises:
    ModelConfigError: shapes that do not line up.
  """
  ks = _check_ks(ks)
  q = tf.convert_to_tensor(query_embeddings, tf.float32)
  c = tf.convert_to_tensor(candidate_embeddings, tf.float32)
  cids = tf.reshape(tf.cast(candidate_ids, tf.int64), [-1])
  tids = tf.reshape(tf.cast(true_ids, tf.int64), [-1])
  if q.shape.rank != 2 or c.shape.rank != 2 or q.shape[1] != c.shape[1]:
    raise ModelConfigError(
      f"hit_rates: query embeddings {q.shape} and candidate embeddings "
      f"{c.shape} "
      "must be [Q, K] and [N, K]."
    )
  if cids.shape[0] != c.shape[0] or tids.shape[0] != q.shape[0]:
    raise ModelConfigError(
      f"hit_rates: {cids.shape[0]} candidate ids for {c.shape[0]} candidates "
      "and "
      f"{tids.shape[0]} true ids for {q.shape[0]} queries; lengths must match."
    )
  if exclusions is not None and int(exclusions.shape[0]) != q.shape[0]:
    raise ModelConfigError(
      f"hit_rates: {exclusions.shape[0]} rows of exclusions for "
      f"{q.shape[0]} queries; give one row per query."
    )
  num_queries = int(q.shape[0])
  top = min(max(ks), int(c.shape[0]))
  id_space = int(tf.reduce_max(cids)) + 1 if cids.shape[0] else 1
  hits = np.zeros(len(ks))
  for start in range(0, num_queries, query_batch_size):
    end = start + query_batch_size
    true = tids[start:end, tf.newaxis]
    scores = tf.matmul(q[start:end], c, transpose_b=True)
    if exclusions is not None:
      excluded = exclusions[start:end]
      if isinstance(excluded, tf.RaggedTensor):
        excluded = excluded.to_tensor(default_value=-1)
      excluded = tf.cast(excluded, tf.int64)
      excluded = tf.where(
        tf.equal(excluded, true), tf.constant(-1, tf.int64), excluded
      )
      mask = retrieval_index.excluded_mask(excluded, id_space)
      scores = tf.where(tf.gather(mask, cids, axis=1), -np.inf, scores)
    _, rows = tf.math.top_k(scores, k=top)
    retrieved = tf.gather(cids, rows)  # [b, top]
    match = tf.equal(retrieved, true).numpy()
    for i, k in enumerate(ks):
      hits[i] += match[:, :k].any(axis=1).sum()
  return {_key(k): float(h / max(num_queries, 1)) for k, h in zip(ks, hits)}


def popularity_hit_rates(
  train_ids: Sequence[int],
  true_ids: Sequence[int],
  ks: Sequence[int] = (1, 5, 10, 50, 100),
  exclusions: Any = None,
) -> dict[str, float]:
  """Hit rates of the k most frequent training candidates for everyone.

  Ties in frequency are broken by the smaller id.

  Args:
    train_ids: candidate id of every training interaction.
    true_ids: `[Q]` held-out candidate id of each query.
    ks: cut-offs.
    exclusions: as `hit_rates`: per query, candidates left out (its user's
      seen items); the k most popular of the others count.

  Returns:
    `{"top_{k}_hit_rate": fraction}` for each k.
  """
  ks = _check_ks(ks)
  train = np.asarray(train_ids, dtype=np.int64).reshape(-1)
  true = np.asarray(true_ids, dtype=np.int64).reshape(-1)
  ids, counts = np.unique(train, return_counts=True)  # ids ascending
  if exclusions is not None:
    # A score per candidate: its count (top_k keeps the smaller id first).
    return hit_rates(
      np.ones([true.size, 1], np.float32),
      counts[:, np.newaxis].astype(np.float32),
      ids,
      true,
      ks,
      exclusions=exclusions,
    )
  ranked = ids[np.argsort(-counts, kind="stable")]
  out = {}
  for k in ks:
    out[_key(k)] = float(np.isin(true, ranked[:k]).mean()) if true.size else 0.0
  return out
