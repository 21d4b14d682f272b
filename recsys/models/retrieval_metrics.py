"""Retrieval quality outside training: corpus hit rates, popularity baseline.

Both return `{"top_{k}_hit_rate": float}` for each k: the fraction of
held-out (query, true candidate) pairs whose true candidate is among the k
best-scoring candidates of the whole corpus (brute force, exact) or among
the k most popular candidates of the training interactions.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from recsys.models.errors import ModelConfigError


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
) -> dict[str, float]:
  """Top-k hit rates of queries against the whole corpus, by brute force.

  Args:
    query_embeddings: `[Q, K]`.
    candidate_embeddings: `[N, K]`, the whole corpus.
    candidate_ids: `[N]` id of each corpus row.
    true_ids: `[Q]` id of each query's held-out candidate.
    ks: cut-offs; a k above N counts all of the corpus.
    query_batch_size: queries scored at once (memory: `[batch, N]` floats).

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
  num_queries = int(q.shape[0])
  top = min(max(ks), int(c.shape[0]))
  hits = np.zeros(len(ks))
  for start in range(0, num_queries, query_batch_size):
    scores = tf.matmul(q[start : start + query_batch_size], c, transpose_b=True)
    _, rows = tf.math.top_k(scores, k=top)
    retrieved = tf.gather(cids, rows)  # [b, top]
    match = tf.equal(
      retrieved, tids[start : start + query_batch_size, tf.newaxis]
    ).numpy()
    for i, k in enumerate(ks):
      hits[i] += match[:, :k].any(axis=1).sum()
  return {_key(k): float(h / max(num_queries, 1)) for k, h in zip(ks, hits)}


def popularity_hit_rates(
  train_ids: Sequence[int],
  true_ids: Sequence[int],
  ks: Sequence[int] = (1, 5, 10, 50, 100),
) -> dict[str, float]:
  """Hit rates of the k most frequent training candidates for everyone.

  Ties in frequency are broken by the smaller id.

  Args:
    train_ids: candidate id of every training interaction.
    true_ids: `[Q]` held-out candidate id of each query.
    ks: cut-offs.

  Returns:
    `{"top_{k}_hit_rate": fraction}` for each k.
  """
  ks = _check_ks(ks)
  train = np.asarray(train_ids, dtype=np.int64).reshape(-1)
  true = np.asarray(true_ids, dtype=np.int64).reshape(-1)
  ids, counts = np.unique(train, return_counts=True)  # ids ascending
  ranked = ids[np.argsort(-counts, kind="stable")]
  out = {}
  for k in ks:
    out[_key(k)] = float(np.isin(true, ranked[:k]).mean()) if true.size else 0.0
  return out
