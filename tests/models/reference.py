"""NumPy references for the model tests: AUC, losses, MLPs, interactions, in-batch softmax."""

import numpy as np


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def auc(labels, scores):
  """Exact ROC AUC (Mann-Whitney U with average ranks for ties)."""
  labels = np.asarray(labels).astype(bool)
  scores = np.asarray(scores, np.float64)
  order = np.argsort(scores, kind="mergesort")
  ranks = np.empty(len(scores))
  sorted_scores = scores[order]
  i = 0
  while i < len(scores):
    j = i
    while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
      j += 1
    ranks[order[i : j + 1]] = 0.5 * (i + j) + 1
    i = j + 1
  pos, neg = labels.sum(), (~labels).sum()
  return (ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg)


def bce_with_logits(labels, logits):
  """Per-example binary cross-entropy of logits (stable form)."""
  labels = np.asarray(labels, np.float64)
  logits = np.asarray(logits, np.float64)
  return (
    np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
  )


def dense_stack(x, layers, final_linear):
  """Applies Keras Dense layers (kernels, biases) with ReLU, last one linear if asked."""
  for i, layer in enumerate(layers):
    kernel, bias = [w.numpy() for w in layer.weights]
    x = x @ kernel + bias
    if not (final_linear and i == len(layers) - 1):
      x = np.maximum(x, 0.0)
  return x


def dot_interaction(vectors, self_interaction):
  """Pairwise dots x_i . x_j for i > j (i >= j with self-interaction), row-major order."""
  out = []
  for i in range(len(vectors)):
    for j in range(i + 1 if self_interaction else i):
      out.append(np.sum(vectors[i] * vectors[j], axis=-1))
  return np.stack(out, axis=-1)


def in_batch_softmax_loss(
  q, c, ids=None, temperature=None, sampling_probability=None, logq_weight=1.0
):
  """Per-query in-batch softmax cross-entropy (positive on the diagonal).

  logits = q c^T / temperature - logq_weight * log(p_j); negatives sharing
  the positive's id are dropped.
  """
  logits = q.astype(np.float64) @ c.astype(np.float64).T
  if temperature is not None:
    logits = logits / temperature
  if sampling_probability is not None:
    logits = logits - logq_weight * np.log(sampling_probability)[np.newaxis, :]
  n = len(q)
  losses = np.zeros(n)
  for i in range(n):
    keep = np.ones(n, bool)
    if ids is not None:
      keep = ids != ids[i]
      keep[i] = True
    row = logits[i, keep]
    m = row.max()
    losses[i] = -(logits[i, i] - m - np.log(np.exp(row - m).sum()))
  return losses


def top_k_hits(q, corpus, corpus_ids, true_ids, ks):
  """Brute-force top-k hit rates: is the true id among the k best-scoring corpus rows?"""
  scores = q @ corpus.T
  order = np.argsort(-scores, axis=1, kind="stable")
  ranked_ids = np.asarray(corpus_ids)[order]
  return {
    k: float(np.mean([t in r[:k] for t, r in zip(true_ids, ranked_ids)]))
    for k in ks
  }
