"""The benchmark's implicit ALS baseline against its dense NumPy objective."""

import numpy as np
import pytest

from benchmarks import movielens_baselines as baselines


def _planted_pairs(seed: int = 0) -> dict[str, np.ndarray]:
  """Two taste groups: users 1-20 rate items 1-15, users 21-40 items 16-30
  (each user 8 of their group's items), plus item 31 nobody rated."""
  rng = np.random.default_rng(seed)
  users, items = [], []
  for user in range(1, 41):
    group = range(1, 16) if user <= 20 else range(16, 31)
    chosen = rng.choice(list(group), size=8, replace=False)
    users += [user] * len(chosen)
    items += chosen.tolist()
  return {"user": np.array(users), "item": np.array(items)}


def _dense_objective(p, q, pairs, reg, alpha):
  x = np.zeros((p.shape[0], q.shape[0]))
  x[pairs["user"], pairs["item"]] = 1.0
  confidence = 1.0 + alpha * x
  return (confidence * (x - p @ q.T) ** 2).sum() + reg * (
    (p**2).sum() + (q**2).sum()
  )


@pytest.mark.parametrize(
  "w0, nu, reg", [(1.0, 0.0, 3.0), (0.5, 1.0, 0.05)], ids=["plain", "rendle"]
)
def test_ials_item_step_solves_the_dense_normal_equations(w0, nu, reg):
  pairs = _planted_pairs()
  alpha = 10.0
  p, q = baselines.fit_ials(
    pairs,
    40,
    31,
    dim=4,
    reg=reg,
    alpha=alpha,
    unobserved_weight=w0,
    reg_exponent=nu,
  )
  x = np.zeros((41, 32))
  x[pairs["user"], pairs["item"]] = 1.0
  confidence = w0 + alpha * x
  # Frequency-scaled: item i's lambda grows with its raters (41 user rows).
  lam = reg * (alpha * x.sum(0) + w0 * 41) ** nu
  # The last half-step solved the items given the users: the gradient of the
  # whole objective with respect to every rated item's factors is zero.
  grad_q = -2 * (confidence * (x - p @ q.T)).T @ p + 2 * lam[:, None] * q
  rated = np.unique(pairs["item"])
  np.testing.assert_allclose(grad_q[rated], 0.0, atol=1e-8)
  # An item nobody rated keeps zero factors (it is not solved).
  np.testing.assert_array_equal(q[31], 0.0)


def test_ials_objective_never_rises_over_alternations():
  pairs = _planted_pairs()
  losses = [
    _dense_objective(
      *baselines.fit_ials(pairs, 40, 31, dim=4, reg=3.0, alpha=10.0, iters=k),
      pairs,
      3.0,
      10.0,
    )
    for k in (1, 2, 3, 5)
  ]
  assert all(b <= a + 1e-9 for a, b in zip(losses, losses[1:])), losses
  assert losses[-1] < 0.9 * losses[0]


def test_ials_finds_the_planted_groups_and_beats_popularity():
  fit, held_out = _planted_pairs(seed=0), _planted_pairs(seed=1)
  p, q = baselines.fit_ials(fit, 40, 31, dim=4, reg=1.0, alpha=10.0)
  rates = baselines.factor_hit_rates(p, q, held_out, 31, ks=(10, 15))
  top = baselines.popularity(fit["item"], held_out["item"])
  # A user's 15 best items are its group's 15, and every held-out pair lies
  # in the user's group; the most popular 10 mix both groups.
  assert rates["top15"] > 0.95
  assert rates["top10"] > top["top10"] + 0.2


def test_choose_ials_picks_the_best_validation_point(monkeypatch):
  monkeypatch.setattr(
    baselines,
    "IALS_GRID",
    ((1e4, 10.0, 0.0), (1.0, 10.0, 0.0), (10.0, 10.0, 1.0)),
  )
  reg, alpha, nu, rates = baselines.choose_ials(
    _planted_pairs(0), _planted_pairs(1), 40, 31
  )
  # reg 1e4 (or 10 x (10 |I_u| + 32) with nu = 1) shrinks every factor to
  # ~0 (ties broken arbitrarily): worse.
  assert (reg, alpha, nu) == (1.0, 10.0, 0.0)
  assert rates["top10"] > 0.5


def test_rows_by_key_groups_values_under_their_keys():
  groups = baselines._rows_by_key(
    np.array([2, 0, 2, 3]), np.array([5, 6, 7, 8]), 5
  )
  assert [g.tolist() for g in groups] == [[6], [], [5, 7], [8], []]


if __name__ == "__main__":
  pytest.main([__file__])
