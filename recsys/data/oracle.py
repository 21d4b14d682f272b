"""Bayes-optimal metrics from true probabilities (NumPy), for synthetic sources.

When the click probability `p` of every example is known, the best any model
can do is to predict `p` itself. Its expected AUC and log-loss follow from `p`
alone (labels integrated out), which is far less noisy than sampling labels.
"""

import numpy as np


def expected_auc(scores: np.ndarray, p: np.ndarray) -> float:
  """Expected ROC AUC of `scores` when label i ~ Bernoulli(p[i]), independently.

  AUC over the ordered pairs (i positive, j negative, i != j), as the ratio of
  expected counts: sum_{i != j} p_i (1 - p_j) [s_i > s_j] (ties count 1/2),
  divided by sum_{i != j} p_i (1 - p_j). For large samples this is the
  expected AUC of the scorer on labels drawn from `p`.

  Args:
    scores: `[N]` predictions (any monotone scale).
    p: `[N]` true positive probabilities.

  Returns:
    The expected AUC in [0, 1]; 0.5 for a constant scorer.
  """
  s = np.asarray(scores, np.float64).ravel()
  p = np.asarray(p, np.float64).ravel()
  if s.shape != p.shape:
    raise ValueError(
      f"scores has {s.size} entries but p has {p.size}; they must match."
    )
  q = 1.0 - p
  _, group = np.unique(s, return_inverse=True)  # ties share a group
  pos_in = np.bincount(group, weights=p)  # [G] positive mass per group
  neg_in = np.bincount(group, weights=q)  # [G] negative mass per group
  neg_below = np.cumsum(neg_in) - neg_in  # negatives with strictly lower score
  # Pairs inside a tie group count 1/2, excluding the i == j pairs.
  same = pos_in * neg_in - np.bincount(group, weights=p * q)
  numerator = np.sum(pos_in * neg_below) + 0.5 * np.sum(same)
  denominator = p.sum() * q.sum() - np.sum(p * q)
  if denominator <= 0:
    raise ValueError(
      "expected_auc needs both positive and negative probability mass."
    )
  return float(numerator / denominator)


def expected_logloss(
  predictions: np.ndarray, p: np.ndarray, eps: float = 1e-7
) -> float:
  """Expected binary cross-entropy of `predictions` under labels ~ Bernoulli(p).

  With `predictions == p` this is the mean binary entropy, the Bayes log-loss.
  """
  y = np.clip(np.asarray(predictions, np.float64), eps, 1.0 - eps)
  p = np.asarray(p, np.float64)
  return float(np.mean(-(p * np.log(y) + (1.0 - p) * np.log1p(-y))))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
  """Exact ROC AUC of `scores` against 0/1 `labels` (Mann-Whitney, ties 1/2)."""
  labels = np.asarray(labels).ravel().astype(bool)
  return expected_auc(scores, labels.astype(np.float64))
