"""The least-squares math of implicit ALS, on tensors (no tables, no model).

iALS (Hu, Koren and Volinsky, 2008; Rendle et al., "Revisiting the
Performance of iALS on Item Recommendation Benchmarks", 2022) minimizes,
over every user-item pair, c_ui (x_ui - p_u . q_i)^2 + regularization, with
x_ui = 1 for an observed pair, else 0, and confidence c_ui = alpha + w0 for
an observed pair, w0 (the unobserved weight) for every other pair. With the
items fixed, each user's row has a closed form:

  (w0 G + alpha Q_u^T Q_u + lambda_u I) p_u = (alpha + w0) sum_{i in I_u} q_i

G = Q^T Q the Gramian of the whole item table, Q_u the user's items' rows,
lambda_u = reg * (alpha |I_u| + w0 |I|)^reg_exponent (the frequency-scaled
regularization of Rendle et al.; exponent 0: plain `reg`). The same holds
for items with users and items swapped. With w0 = 1 and exponent 0 this is
the benchmark's NumPy iALS (`benchmarks/movielens_baselines.fit_ials`).

Shapes are static (histories padded with zero rows, which add nothing to
either side), so every function compiles under `tf.function(jit_compile=True)`.
"""

import tensorflow as tf


@tf.autograph.experimental.do_not_convert
def gramian(rows: tf.Tensor) -> tf.Tensor:
  """Sum of v v^T over every row `[..., D]` (zero padding rows add nothing):
  `[D, D]`. Cost O(n D^2) for n rows."""
  flat = tf.reshape(rows, [-1, tf.shape(rows)[-1]])
  return tf.linalg.matmul(flat, flat, transpose_a=True)


@tf.autograph.experimental.do_not_convert
def row_regularization(
  counts: tf.Tensor,
  reg: float,
  alpha: float,
  unobserved_weight: float,
  reg_exponent: float,
  corpus_size: int,
) -> tf.Tensor:
  """lambda_u `[B]` of each row from its number of observed pairs `[B]`."""
  counts = tf.cast(counts, tf.float32)
  if reg_exponent == 0.0:
    return tf.fill(tf.shape(counts), tf.constant(reg, tf.float32))
  weight = alpha * counts + unobserved_weight * float(corpus_size)
  return reg * tf.pow(weight, reg_exponent)


@tf.autograph.experimental.do_not_convert
def solve_rows(
  other_gramian: tf.Tensor,
  history: tf.Tensor,
  regularization: tf.Tensor,
  alpha: float,
  unobserved_weight: float,
  segments: tf.Tensor | None = None,
) -> tf.Tensor:
  """Each row's exact weighted least-squares solution `[B, D]`.

  Args:
    other_gramian: `[D, D]`, the other side's whole-table Gramian.
    history: `[B, L, D]` the other side's rows each row observed, padded
      with zero rows.
    regularization: `[B]` lambda per row (`row_regularization`), > 0.
    alpha: the extra weight of an observed pair.
    unobserved_weight: w0, the weight of every pair.
    segments: `[B]` int32, entry b's row is the one at position
      `segments[b]` (a long history cut into several entries,
      `recsys.data.ials_batches`): the entries' sums are added there before
      the solve, and every entry gets its row's solution. None: each entry
      is its own row.

  Returns:
    `[B, D]`; a row with an empty history solves to zeros. Cost O(B (L D^2
    + D^3)): the batched Cholesky factorization of B D x D systems.
  """
  observed = tf.linalg.matmul(history, history, transpose_a=True)  # [B,D,D]
  summed = tf.reduce_sum(history, axis=1)  # [B, D]
  if segments is not None:
    rows = tf.shape(history)[0]
    observed = tf.math.unsorted_segment_sum(observed, segments, rows)
    summed = tf.math.unsorted_segment_sum(summed, segments, rows)
  solved = solve_systems(
    other_gramian, observed, summed, regularization, alpha, unobserved_weight
  )
  if segments is None:
    return solved
  return tf.gather(solved, segments)


@tf.autograph.experimental.do_not_convert
def solve_systems(
  other_gramian: tf.Tensor,
  observed: tf.Tensor,
  summed: tf.Tensor,
  regularization: tf.Tensor,
  alpha: float,
  unobserved_weight: float,
) -> tf.Tensor:
  """Each row's solution `[B, D]` from its history's sums: `observed`
  `[B, D, D]` (Q_u^T Q_u) and `summed` `[B, D]` (sum of q_i), wherever
  they were added up (one batch, or several steps of a long history)."""
  eye = tf.eye(tf.shape(summed)[-1], dtype=summed.dtype)
  matrix = (
    unobserved_weight * other_gramian[tf.newaxis]
    + alpha * observed
    + regularization[:, tf.newaxis, tf.newaxis] * eye
  )
  rhs = (alpha + unobserved_weight) * summed
  factor = tf.linalg.cholesky(matrix)
  return tf.linalg.cholesky_solve(factor, rhs[..., tf.newaxis])[..., 0]
