"""NumPy reference of the TPU embedding optimizers' sparse row updates.

Plain NumPy (float64) written from the formulas of docs/optimizers.md and
TF's `optimization_parameters.proto`, to test every backend's embedding
optimizer against (the tests and `backends.conformance`, which a third-party
backend's tests can run too). One function per optimizer, each

    new_table, new_slots = adagrad(table, slots, ids, grads, optimizer)

with `table` `[V, D]`, `slots` {TF slot name: `[V, D]`}, `ids` `[U]` unique
row ids, `grads` `[U, D]` (each row's gradient already summed over the global
batch; see `sum_duplicates`) and `optimizer` a
`tf.tpu.experimental.embedding` optimizer object, of which only plain
attributes are read. Inputs are not modified. `apply` dispatches on the
optimizer's type and `initial_slots` gives the slots' starting values.

One step, per table: (1) gradient clipping, (2) decoupled weight decay
`w -= d * w` (`d = weight_decay_factor [* lr]`), (3) the update, (4) weight
clipping — on the rows in `ids` only, except non-lazy Adam, which steps every
row with `g = 0` for the rows not in `ids`.
"""

from collections.abc import Callable
from typing import Any

import numpy as np

Slots = dict[str, np.ndarray]
_RowUpdate = Callable[
  [Any, float, np.ndarray, Slots, np.ndarray], tuple[np.ndarray, Slots]
]


def learning_rate(optimizer: Any) -> float:
  """The optimizer's learning rate now (a callable one is called)."""
  lr = optimizer.learning_rate
  if callable(lr):
    lr = lr()
  return float(np.asarray(lr))


def initial_slots(optimizer: Any, vocabulary_size: int, dim: int) -> Slots:
  """Each slot's initial value, `[vocabulary_size, dim]` float32.

  Adagrad and FTRL accumulators start at `initial_accumulator_value`; every
  other slot (AdagradMomentum's accumulators and momenta, Adam's momenta and
  velocities, FTRL's linears) starts at 0.
  """
  shape = (vocabulary_size, dim)
  kind = _kind(optimizer)
  if kind == "SGD":
    return {}
  if kind == "Adagrad":
    return {
      "accumulators": np.full(
        shape, optimizer.initial_accumulator_value, np.float32
      )
    }
  if kind == "AdagradMomentum":
    return {
      "accumulators": np.zeros(shape, np.float32),
      "momenta": np.zeros(shape, np.float32),
    }
  if kind == "Adam":
    return {
      "momenta": np.zeros(shape, np.float32),
      "velocities": np.zeros(shape, np.float32),
    }
  return {
    "accumulators": np.full(
      shape, optimizer.initial_accumulator_value, np.float32
    ),
    "linears": np.zeros(shape, np.float32),
  }


def sum_duplicates(
  ids: np.ndarray, grads: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """Sums the gradients of repeated ids: ids `[N]`, grads `[N, D]` -> unique.

  Returns:
    (unique ids `[U]` sorted, summed gradients `[U, D]`): the TPU's gradient
    accumulation over the global batch.
  """
  ids = np.asarray(ids)
  unique, inverse = np.unique(ids, return_inverse=True)
  summed = np.zeros((len(unique),) + np.shape(grads)[1:], np.float64)
  np.add.at(summed, inverse.reshape(-1), np.asarray(grads, np.float64))
  return unique, summed


def first_step(
  optimizer: Any, table: np.ndarray, ids: np.ndarray, grads: np.ndarray
) -> tuple[np.ndarray, Slots]:
  """The first step of `optimizer` on a table whose slots are still at
  their initial values: a batch's `ids` `[N]` and per-lookup `grads`
  `[N, D]` (duplicates summed). Returns (new table, new slots)."""
  unique, summed = sum_duplicates(ids, grads)
  slots = initial_slots(optimizer, *np.shape(table))
  return apply(optimizer, table, slots, unique, summed)


# -- the update of each optimizer on rows (after clipping and decay) -----------


def _sgd_rows(opt, lr, w, s, g):
  del opt
  return w - lr * g, s


def _adagrad_rows(opt, lr, w, s, g):
  del opt
  acc = s["accumulators"] + g**2
  return w - lr * g / np.sqrt(acc), {"accumulators": acc}


def _adagrad_momentum_rows(opt, lr, w, s, g):
  if opt.beta2 == 1:
    acc = s["accumulators"] + g**2
  else:
    acc = opt.beta2 * s["accumulators"] + (1 - opt.beta2) * g**2
  scaled = (acc + opt.epsilon) ** (-1.0 / opt.exponent) * g
  m = opt.momentum * s["momenta"] + scaled
  u = opt.momentum * m + scaled if opt.use_nesterov else m
  return w - lr * u, {"accumulators": acc, "momenta": m}


def _adam_rows(opt, lr, w, s, g):
  m = opt.beta_1 * s["momenta"] + (1 - opt.beta_1) * g
  v = opt.beta_2 * s["velocities"] + (1 - opt.beta_2) * g**2
  if opt.sum_inside_sqrt:
    w = w - lr * m / np.sqrt(v + opt.epsilon**2)
  else:
    w = w - lr * m / (np.sqrt(v) + opt.epsilon)
  return w, {"momenta": m, "velocities": v}


def _ftrl_rows(opt, lr, w, s, g):
  """FTRL-Proximal (McMahan et al. 2013, Algorithm 1) with TPU extras.

  With `p = learning_rate_power`, `n' = n + g^2`, `sigma = n'^-p - n^-p`:
    z <- z + g - sigma / lr * w
    w <- (sign(z) * l1 - z) / ((n'^-p + beta) / lr + 2 * l2)  if |z| > l1 else 0
  With `multiply_linear_by_learning_rate` the `linears` slot holds z * lr:
    z <- z + lr * g - sigma * w
    w <- (sign(z) * l1 * lr - z) / (n'^-p + 2 * l2 * lr + beta)
         if |z| > l1 * lr else 0
  With `allow_zero_accumulator` a zero denominator (n' = 0, l2 = beta = 0)
  gives w = 0 instead of NaN or infinity.
  """
  n, z = s["accumulators"], s["linears"]
  l1, l2 = opt.l1_regularization_strength, opt.l2_regularization_strength
  n_new = n + g**2
  sigma = n_new ** (-opt.learning_rate_power) - n ** (-opt.learning_rate_power)
  if opt.multiply_linear_by_learning_rate:
    z = z + lr * g - sigma * w
    threshold = l1 * lr
    denominator = n_new ** (-opt.learning_rate_power) + 2 * l2 * lr + opt.beta
  else:
    z = z + g - sigma / lr * w
    threshold = l1
    denominator = (n_new ** (-opt.learning_rate_power) + opt.beta) / lr + 2 * l2
  numerator = np.sign(z) * threshold - z
  with np.errstate(divide="ignore", invalid="ignore"):
    w = numerator / denominator
  if opt.allow_zero_accumulator:
    w = np.where(denominator == 0, 0.0, w)
  w = np.where(np.abs(z) > threshold, w, 0.0)
  return w, {"accumulators": n_new, "linears": z}


_ROW_UPDATES: dict[str, _RowUpdate] = {
  "SGD": _sgd_rows,
  "Adagrad": _adagrad_rows,
  "AdagradMomentum": _adagrad_momentum_rows,
  "Adam": _adam_rows,
  "FTRL": _ftrl_rows,
}


def _kind(optimizer: Any) -> str:
  for cls in type(optimizer).__mro__:
    if cls.__name__ in _ROW_UPDATES:
      return cls.__name__
  raise ValueError(
    f"no NumPy reference for {type(optimizer).__name__}; have "
    f"{sorted(_ROW_UPDATES)}."
  )


def _clip(x: np.ndarray, lo: float | None, hi: float | None):
  if lo is not None:
    x = np.maximum(x, lo)
  if hi is not None:
    x = np.minimum(x, hi)
  return x


def apply(
  optimizer: Any,
  table: np.ndarray,
  slots: Slots,
  ids: np.ndarray,
  grads: np.ndarray,
  lr: float | None = None,
) -> tuple[np.ndarray, Slots]:
  """One step of `optimizer` on rows `ids`; returns (new table, new slots).

  Args:
    optimizer: a `tf.tpu.experimental.embedding` optimizer object.
    table: `[V, D]`.
    slots: {slot name: `[V, D]`}.
    ids: `[U]` unique row ids.
    grads: `[U, D]`, summed over the global batch.
    lr: the learning rate to use; default: `learning_rate(optimizer)`.

  Returns:
    float64 copies of the table and slots after the step.
  """
  opt = optimizer
  lr = learning_rate(opt) if lr is None else float(lr)
  ids = np.asarray(ids, np.int64).reshape(-1)
  grads = np.asarray(grads, np.float64).reshape(len(ids), -1)
  if len(np.unique(ids)) != len(ids):
    raise ValueError(f"ids must be unique (use sum_duplicates); got {ids}.")
  table = np.array(table, np.float64)
  slots = {k: np.array(v, np.float64) for k, v in slots.items()}
  if _kind(opt) == "Adam" and not opt.lazy_adam:
    rows = np.arange(table.shape[0])
    g = np.zeros_like(table)
    g[ids] = grads
  else:
    rows, g = ids, grads
  g = _clip(g, opt.clip_gradient_min, opt.clip_gradient_max)
  w = table[rows]
  if opt.weight_decay_factor:
    d = opt.weight_decay_factor
    if opt.multiply_weight_decay_factor_by_learning_rate:
      d *= lr
    w = w - d * w
  w, new_rows = _ROW_UPDATES[_kind(opt)](
    opt, lr, w, {k: v[rows] for k, v in slots.items()}, g
  )
  table[rows] = _clip(w, opt.clip_weight_min, opt.clip_weight_max)
  for k in slots:
    slots[k][rows] = new_rows[k]
  return table, slots


def _apply_as(kind, table, slots, ids, grads, optimizer, lr):
  if _kind(optimizer) != kind:
    raise ValueError(
      f"the {kind} reference got a {type(optimizer).__name__} "
      "optimizer; use apply() to dispatch on the type."
    )
  return apply(optimizer, table, slots, ids, grads, lr)


def sgd(table, slots, ids, grads, optimizer, lr=None):
  """SGD: `w <- w - lr * g`. No slots."""
  return _apply_as("SGD", table, slots, ids, grads, optimizer, lr)


def adagrad(table, slots, ids, grads, optimizer, lr=None):
  """Adagrad without epsilon: `acc += g^2; w -= lr * g / sqrt(acc)`."""
  return _apply_as("Adagrad", table, slots, ids, grads, optimizer, lr)


def adagrad_momentum(table, slots, ids, grads, optimizer, lr=None):
  """Adagrad with momentum.

  `acc += g^2` (beta2 == 1) or `acc = beta2 * acc + (1 - beta2) * g^2`;
  `s = (acc + epsilon)^(-1/exponent) * g`; `m = momentum * m + s`;
  `w -= lr * (momentum * m + s if use_nesterov else m)`.
  """
  return _apply_as("AdagradMomentum", table, slots, ids, grads, optimizer, lr)


def adam(table, slots, ids, grads, optimizer, lr=None):
  """Adam without bias correction, lazy unless `lazy_adam=False`.

  `m = b1 * m + (1 - b1) * g`; `v = b2 * v + (1 - b2) * g^2`;
  `w -= lr * m / sqrt(v + eps^2)` (sum_inside_sqrt) or
  `w -= lr * m / (sqrt(v) + eps)`.
  """
  return _apply_as("Adam", table, slots, ids, grads, optimizer, lr)


def ftrl(table, slots, ids, grads, optimizer, lr=None):
  """FTRL-Proximal; see `_ftrl_rows` for the formulas."""
  return _apply_as("FTRL", table, slots, ids, grads, optimizer, lr)
