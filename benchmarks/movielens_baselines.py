"""The MovieLens benchmark's baselines, fit in NumPy on the same splits.

Ratings: the global mean, a damped user+item bias model and a plain biased
matrix factorization (explicit ALS). Retrieval: the most popular items,
implicit ALS (iALS, Hu, Koren and Volinsky, 2008), the classic strong
baseline for top-K hit rates over a whole corpus, and EASE (Steck, 2019),
the closed-form linear item-item autoencoder, strongest when the items a
user has seen are excluded. Each takes the arrays of
`movielens_benchmark.split_arrays` (`user`, `item`, `label`); hyper-parameter
grids are searched on a validation split by the benchmark, never on test,
for each protocol (seen items kept, or excluded: `exclusions`, each held-out
pair's user's training items, `recsys.models.retrieval.seen_items`).
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]

MF_DIM = 32
MF_REG_GRID = (0.1, 0.2, 0.35)
FIXED_DAMPING = (10.0, 25.0)  # (user, item)
DAMPING_GRID = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0)
IALS_DIM = 32
# (L2 regularization, confidence alpha, regularization exponent nu):
# observed pairs weigh 1 + alpha, every unobserved pair 1; a row's
# regularization is reg * (alpha |I_u| + |I|)^nu (nu 0: plain reg).
IALS_GRID = (
  (30.0, 10.0, 0.0),
  (100.0, 10.0, 0.0),
  (300.0, 10.0, 0.0),
  (100.0, 20.0, 0.0),
  (30.0, 3.0, 0.0),
  (0.02, 3.0, 1.0),
  (0.03, 3.0, 1.0),
  (0.03, 10.0, 1.0),
)
# L2 regularization of EASE's item-item weights.
EASE_GRID = (100.0, 250.0, 500.0, 1000.0)
KS = (1, 5, 10, 50, 100)


def fit_bias(
  train: Arrays, user_damping: float, item_damping: float
) -> Callable:
  """Damped bias baseline: r = mu + b_i + b_u, fit on `train`.

  b_i = sum(r - mu) / (n_i + item_damping) over the item's ratings;
  b_u = sum(r - mu - b_i) / (n_u + user_damping) over the user's ratings.

  Returns:
    predict(users, items) -> ratings clipped to the training rating range.
  """
  user, item, rating = (
    train["user"],
    train["item"],
    train["label"].astype(np.float64),
  )
  mu = rating.mean()
  size = int(max(user.max(), item.max())) + 1
  item_sum = np.bincount(item, rating - mu, minlength=size)
  item_bias = item_sum / (np.bincount(item, minlength=size) + item_damping)
  user_sum = np.bincount(user, rating - mu - item_bias[item], minlength=size)
  user_bias = user_sum / (np.bincount(user, minlength=size) + user_damping)
  lo, hi = rating.min(), rating.max()

  def predict(users: np.ndarray, items: np.ndarray) -> np.ndarray:
    users = np.minimum(users, size - 1)
    items = np.minimum(items, size - 1)
    return np.clip(mu + item_bias[items] + user_bias[users], lo, hi)

  return predict


def rmse(predicted: np.ndarray, actual: np.ndarray) -> float:
  """Root mean squared error."""
  return float(np.sqrt(np.mean((predicted - actual.astype(np.float64)) ** 2)))


def choose_damping(train: Arrays, valid: Arrays) -> tuple[float, float, float]:
  """(user damping, item damping, validation RMSE) of the best grid point."""
  scores = [
    (
      du,
      di,
      rmse(
        fit_bias(train, du, di)(valid["user"], valid["item"]), valid["label"]
      ),
    )
    for du in DAMPING_GRID
    for di in DAMPING_GRID
  ]
  return min(scores, key=lambda x: x[2])


def fit_mf(
  train: Arrays, dim: int = MF_DIM, reg: float = 0.2, iters: int = 8
) -> Callable:
  """Plain biased MF by alternating least squares (ALS-WR), fit on `train`.

  r = mu + b_u + b_i + p_u . q_i, the L2 penalty on a user's (p_u, b_u)
  and an item's (q_i, b_i) scaled by its number of ratings (Zhou et al.,
  2008); seeded initialization.

  Returns:
    predict(users, items) -> ratings clipped to the training rating range.
  """
  user, item = train["user"].astype(np.int64), train["item"].astype(np.int64)
  rating = train["label"].astype(np.float64)
  mu = rating.mean()
  nu, ni = int(user.max()) + 1, int(item.max()) + 1
  rng = np.random.default_rng(0)
  p = rng.normal(0, 0.1, (nu, dim))
  q = rng.normal(0, 0.1, (ni, dim))
  bu, bi = np.zeros(nu), np.zeros(ni)
  rows = np.arange(len(user))
  by_user = _rows_by_key(user, rows, nu)
  by_item = _rows_by_key(item, rows, ni)

  def solve(rows, other, other_bias, target_ids):
    out = np.zeros((len(rows), dim + 1))
    eye = np.eye(dim + 1)
    for k, r in enumerate(rows):
      if not len(r):
        continue
      x = np.concatenate([other[target_ids[r]], np.ones((len(r), 1))], 1)
      y = rating[r] - mu - other_bias[target_ids[r]]
      out[k] = np.linalg.solve(x.T @ x + reg * len(r) * eye, x.T @ y)
    return out

  for _ in range(iters):
    sol = solve(by_user, q, bi, item)
    p, bu = sol[:, :dim], sol[:, dim]
    sol = solve(by_item, p, bu, user)
    q, bi = sol[:, :dim], sol[:, dim]
  lo, hi = rating.min(), rating.max()

  def predict(users: np.ndarray, items: np.ndarray) -> np.ndarray:
    u, i = np.minimum(users, nu - 1), np.minimum(items, ni - 1)
    return np.clip(mu + bu[u] + bi[i] + (p[u] * q[i]).sum(-1), lo, hi)

  return predict


def choose_mf_reg(train: Arrays, valid: Arrays) -> tuple[float, float]:
  """(regularization, validation RMSE) of the best MF_REG_GRID point."""
  scores = [
    (
      reg,
      rmse(
        fit_mf(train, reg=reg)(valid["user"], valid["item"]), valid["label"]
      ),
    )
    for reg in MF_REG_GRID
  ]
  return min(scores, key=lambda x: x[1])


def popularity(
  train_items: np.ndarray, held_out_items: np.ndarray, exclusions: Any = None
) -> dict[str, float]:
  """Most-popular top-K hit rates (`recsys.models.popularity_hit_rates`);
  with `exclusions`, the most popular items each user has not seen."""
  from recsys.models.retrieval import metrics as retrieval_metrics  # noqa: PLC0415 (imports TF)

  rates = retrieval_metrics.popularity_hit_rates(
    train_items.tolist(), held_out_items.tolist(), KS, exclusions=exclusions
  )
  return {f"top{k}": rates[f"top_{k}_hit_rate"] for k in KS}


def fit_ials(
  train: Arrays,
  num_users: int,
  num_items: int,
  dim: int = IALS_DIM,
  reg: float = 100.0,
  alpha: float = 10.0,
  iters: int = 10,
  seed: int = 0,
  unobserved_weight: float = 1.0,
  reg_exponent: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
  """Implicit ALS on the (user, item) pairs of `train` (labels ignored).

  Minimizes sum over all user-item pairs of c_ui (x_ui - p_u . q_i)^2 +
  sum_u lambda_u |p_u|^2 + sum_i lambda_i |q_i|^2, x_ui = 1 for a training
  pair, else 0, with confidence c_ui = w0 + alpha for a training pair, else
  w0. Each half-step solves every row's normal equations exactly, with the
  Gramian shared by all rows (Hu et al., 2008): (w0 Q^T Q + alpha Q_u^T Q_u
  + lambda_u I) p_u = (w0 + alpha) sum_{i in I_u} q_i, lambda_u = reg
  (alpha |I_u| + w0 |I|)^nu (Rendle et al., 2022; |I| the other table's
  rows) — `recsys.models.ImplicitALS`'s math.

  Args:
    train: `user` and `item` ids, `[n]` each, in [0, num_users] and
      [0, num_items] (row 0 is the source's out-of-vocabulary id).
    num_users, num_items: the largest ids.
    dim, reg, alpha, iters, seed: factors, regularization, confidence,
      alternations, initialization seed.
    unobserved_weight, reg_exponent: w0 and nu above.

  Returns:
    (user factors `[num_users + 1, dim]`, item factors `[num_items + 1,
    dim]`); score(u, i) = p_u . q_i.
  """
  pairs = np.unique(
    np.stack([train["user"], train["item"]], 1).astype(np.int64), axis=0
  )
  rng = np.random.default_rng(seed)
  p = rng.normal(0, 0.01, (num_users + 1, dim))
  q = rng.normal(0, 0.01, (num_items + 1, dim))
  by_user = _rows_by_key(pairs[:, 0], pairs[:, 1], num_users + 1)
  by_item = _rows_by_key(pairs[:, 1], pairs[:, 0], num_items + 1)
  weights = (reg, alpha, unobserved_weight, reg_exponent)
  for _ in range(iters):
    p = _ials_half_step(q, by_user, *weights)
    q = _ials_half_step(p, by_item, *weights)
  return p, q


def _rows_by_key(
  keys: np.ndarray, values: np.ndarray, size: int
) -> list[np.ndarray]:
  """values grouped by key: `out[k]` = the values paired with key k."""
  order = np.argsort(keys, kind="stable")
  bounds = np.searchsorted(keys[order], np.arange(size + 1))
  return [values[order[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]


def _ials_half_step(
  fixed: np.ndarray,
  observed: list[np.ndarray],
  reg: float,
  alpha: float,
  unobserved_weight: float = 1.0,
  reg_exponent: float = 0.0,
) -> np.ndarray:
  """Exact least-squares solve of every row given the other side's factors."""
  rows, dim = fixed.shape
  w0 = unobserved_weight
  gramian = w0 * fixed.T @ fixed
  out = np.zeros((len(observed), dim))
  for row, cols in enumerate(observed):
    if len(cols):
      f = fixed[cols]
      lam = reg * (alpha * len(cols) + w0 * rows) ** reg_exponent
      out[row] = np.linalg.solve(
        gramian + alpha * f.T @ f + lam * np.eye(dim), (w0 + alpha) * f.sum(0)
      )
  return out


def factor_hit_rates(
  user_factors: np.ndarray,
  item_factors: np.ndarray,
  held_out: Arrays,
  num_items: int,
  ks: Sequence[int] = KS,
  exclusions: Any = None,
) -> dict[str, float]:
  """Top-K hit rates of p_u . q_i over the whole corpus (ids 1..num_items),
  the held-out pairs' users as queries, as for the models
  (`retrieval_metrics.hit_rates`); with `exclusions` (per held-out pair, its
  user's seen items) only the others are ranked."""
  from recsys.models.retrieval import metrics as retrieval_metrics  # noqa: PLC0415 (imports TF)

  corpus = np.arange(1, num_items + 1)
  rates = retrieval_metrics.hit_rates(
    user_factors[held_out["user"]],
    item_factors[corpus],
    corpus,
    held_out["item"],
    ks,
    exclusions=exclusions,
  )
  return {f"top{k}": rates[f"top_{k}_hit_rate"] for k in ks}


def choose_ials(
  train: Arrays,
  valid: Arrays,
  num_users: int,
  num_items: int,
  exclusions: Any = None,
  fitted: dict | None = None,
) -> tuple[float, float, float, dict[str, float]]:
  """(reg, alpha, reg_exponent, validation hit rates) of the IALS_GRID point
  with the best validation top-10 hit rate (under `exclusions`, if given).

  `fitted`: a dict the caller keeps for calls on the same `train` (each
  grid point's factors, fitted once: the fit does not depend on the
  exclusions, only the scoring does)."""
  (reg, alpha, nu), rates = _best_on_validation(
    IALS_GRID,
    lambda point: fit_ials(
      train,
      num_users,
      num_items,
      reg=point[0],
      alpha=point[1],
      reg_exponent=point[2],
    ),
    lambda pq: factor_hit_rates(*pq, valid, num_items, exclusions=exclusions),
    fitted,
  )
  return reg, alpha, nu, rates


def _best_on_validation(
  grid: Sequence[Any],
  fit: Callable[[Any], Any],
  hit_rates: Callable[[Any], dict[str, float]],
  fitted: dict | None,
) -> tuple[Any, dict[str, float]]:
  """(point, its validation hit rates) of the `grid` point whose fit has
  the best validation top-10 hit rate (the first such point). Each point
  is fitted once (`fit(point)`), kept in `fitted` (when given) for the
  caller's next calls on the same training data."""
  fitted = {} if fitted is None else fitted
  scores = []
  for point in grid:
    if point not in fitted:
      fitted[point] = fit(point)
    scores.append((point, hit_rates(fitted[point])))
  return max(scores, key=lambda x: x[1]["top10"])


def interactions(train: Arrays, num_users: int, num_items: int) -> np.ndarray:
  """X `[num_users + 1, num_items + 1]` float32: 1 for the pairs of `train`."""
  x = np.zeros((num_users + 1, num_items + 1), np.float32)
  x[train["user"], train["item"]] = 1.0
  return x


def fit_ease(train: Arrays, num_users: int, num_items: int, reg: float):
  """EASE (Steck, 2019): item-item weights B, score(u, j) = X_u . B_j.

  B minimizes |X - X B|^2 + reg |B|^2 with a zero diagonal (an item may
  not predict itself); closed form B = I - P / diag(P), P = (X^T X +
  reg I)^-1.

  Returns:
    B `[num_items + 1, num_items + 1]` (row and column 0: the OOV id).
  """
  x = interactions(train, num_users, num_items).astype(np.float64)
  gram = x.T @ x + reg * np.eye(num_items + 1)
  inverse = np.linalg.inv(gram)
  weights = -inverse / np.diag(inverse)[np.newaxis, :]
  np.fill_diagonal(weights, 0.0)
  return weights


def ease_hit_rates(
  weights: np.ndarray,
  train: Arrays,
  held_out: Arrays,
  num_users: int,
  num_items: int,
  ks: Sequence[int] = KS,
  exclusions: Any = None,
) -> dict[str, float]:
  """EASE's hit rates: queries X_u (the user's training items, multi-hot),
  candidates the columns of B (`factor_hit_rates` with those factors)."""
  x = interactions(train, num_users, num_items)
  return factor_hit_rates(
    x, weights.T.astype(np.float32), held_out, num_items, ks, exclusions
  )


def choose_ease(
  train: Arrays,
  valid: Arrays,
  num_users: int,
  num_items: int,
  exclusions: Any = None,
  fitted: dict | None = None,
) -> tuple[float, dict[str, float]]:
  """(reg, validation hit rates) of the EASE_GRID point with the best
  validation top-10 hit rate (under `exclusions`, if given); `fitted` as
  `choose_ials`'s (each point's weights, fitted once)."""
  return _best_on_validation(
    EASE_GRID,
    lambda reg: fit_ease(train, num_users, num_items, reg),
    lambda weights: ease_hit_rates(
      weights, train, valid, num_users, num_items, exclusions=exclusions
    ),
    fitted,
  )
