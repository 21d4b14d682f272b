"""The TPU embedding optimizers' sparse row updates, written in TensorFlow ops.

Every backend that applies its own embedding optimizer (tensorcore,
parameter_servers) calls `apply_sparse_update` once per table per step with the
unique rows the step touched and their gradients summed over the global batch.
The math is the TPU's (docs/optimizers.md, TF's
`optimization_parameters.proto`), for the `tf.tpu.experimental.embedding`
optimizer classes, in this order:

  1. gradient clipping (`clipvalue` -> `clip_gradient_min/max`);
  2. decoupled weight decay on the touched rows: `w <- w - d * w`, with
     `d = weight_decay_factor * lr` if
     `multiply_weight_decay_factor_by_learning_rate` else `weight_decay_factor`;
  3. the optimizer's update of the weights and slots;
  4. weight clipping (`clip_weight_min/max`).

Rows not in `ids` are untouched, except for non-lazy Adam (`lazy_adam=False`),
which runs steps 1-4 on every row of the table with `g = 0` for the rows the
step did not touch.

Variables are read and written only through their `.handle` with raw resource
ops (`ResourceGather`, `ResourceScatterUpdate`, ...), so the update works on a
plain `tf.Variable`, and on a `MirroredVariable` in replica context inside
`strategy.run` (each replica updates its own copy with identical data), eagerly
and inside `tf.function` (XLA-compiled or not). TF's fused sparse kernels
(`ResourceSparseApplyAdagradV2`, `ResourceSparseApplyFtrl`) compute the same
math for Adagrad and FTRL but are not used: they have no XLA kernel (so they
cannot run under TPUStrategy) and measured 1.2-2x slower on CPU than this
gather / compute / scatter path (100k x 64 table, 4096 rows per step).

Example:
  >>> opt = tf.tpu.experimental.embedding.Adagrad(learning_rate=0.1)
  >>> table = tf.Variable(tf.zeros([23, 7]))
  >>> slots = {"accumulators": tf.Variable(tf.fill([23, 7], 0.1))}
  >>> apply_sparse_update(opt, table, slots, ids=tf.constant([3, 5]),
  ...                     grads=tf.ones([2, 7]))
"""

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import (
  Any,
  NamedTuple,
)

import tensorflow as tf
from tensorflow.tpu.experimental import embedding

from backends import _bags, _tf_internal
from backends.base import UnsupportedConfigError
from backends.storage import narrow

log = logging.getLogger("recsys.backends")


_Rows = dict[str, tf.Tensor]
_UpdateFn = Callable[
  [Any, tf.Tensor, tf.Tensor, _Rows, tf.Tensor], tuple[tf.Tensor, _Rows]
]


# -- configuration -------------------------------------------------------------


def slot_names(optimizer: Any) -> list[str]:
  """TF's slot names for `optimizer`, e.g. `["accumulators", "linears"]`.

  These are the names TF's mid-level API uses in checkpoints
  (`<table>/<slot>`) and the keys `apply_sparse_update` expects in `slots`.

  Raises:
    UnsupportedConfigError: `optimizer` is not a supported
      `tf.tpu.experimental.embedding` optimizer.
  """
  _validate(optimizer, table_name="<unnamed>")
  return _tf_internal.slot_names(optimizer)


def slot_initializers(optimizer: Any) -> dict[str, Any]:
  """TF's initializer for each slot of `optimizer`, keyed by slot name.

  E.g. Adagrad's `accumulators` start at `initial_accumulator_value`; Adam's
  `momenta` and `velocities` start at 0. Each initializer is called as
  `init(shape, dtype)`.
  """
  _validate(optimizer, table_name="<unnamed>")
  return dict(
    zip(
      _tf_internal.slot_names(optimizer),
      _tf_internal.slot_initializers(optimizer),
    )
  )


def check_supported(optimizer: Any, table_name: str) -> None:
  """Raises if `apply_sparse_update` cannot apply `optimizer` faithfully.

  `use_gradient_accumulation=False` is accepted: this module always sums a
  row's gradients over the global batch before the update, which is the
  accurate behaviour that `False` trades away on a TPU for speed.
  `low_dimensional_packing_status` (a TPU memory layout) is ignored.

  Args:
    optimizer: a `tf.tpu.experimental.embedding` optimizer instance.
    table_name: the table it applies to, for error messages.

  Raises:
    UnsupportedConfigError: `optimizer` is a `CustomOptimizer`, not an
      embedding optimizer at all, or has an invalid hyper-parameter.
  """
  _validate(optimizer, table_name)
  if not optimizer.use_gradient_accumulation:
    log.info(
      "table %r: %s(use_gradient_accumulation=False) is applied with "
      "gradient accumulation (gradients of a row summed over the global "
      "batch), the exact behaviour the TPU approximates when it is off.",
      table_name,
      type(optimizer).__name__,
    )


def _validate(optimizer: Any, table_name: str) -> None:
  """The checks of `check_supported`, without its log message."""
  if isinstance(optimizer, embedding.CustomOptimizer):
    raise UnsupportedConfigError(
      f"table {table_name!r}: tf.tpu.experimental.embedding.CustomOptimizer "
      "runs a user computation that only the TPU embedding engine can "
      f"execute; use one of {_SUPPORTED}, or the 'tpu_embedding' backend "
      "on a TPU."
    )
  if _update_fn(optimizer) is None:
    raise UnsupportedConfigError(
      f"table {table_name!r}: optimizer {type(optimizer).__module__}."
      f"{type(optimizer).__qualname__} is not a "
      f"tf.tpu.experimental.embedding optimizer; use one of {_SUPPORTED} "
      "(Keras optimizers do not apply to embedding tables)."
    )
  lo = optimizer.clip_gradient_min
  hi = optimizer.clip_gradient_max
  if lo is not None and hi is not None and lo > hi:
    raise UnsupportedConfigError(
      f"table {table_name!r}: clipvalue gives clip_gradient_min={lo} > "
      f"clip_gradient_max={hi}; pass clipvalue=c (c > 0) or (min, max) "
      "with min <= max."
    )
  lo, hi = optimizer.clip_weight_min, optimizer.clip_weight_max
  if lo is not None and hi is not None and lo > hi:
    raise UnsupportedConfigError(
      f"table {table_name!r}: clip_weight_min={lo} > clip_weight_max={hi}."
    )
  if isinstance(optimizer, embedding.FTRL):
    if optimizer.learning_rate_power > 0:
      raise UnsupportedConfigError(
        f"table {table_name!r}: FTRL learning_rate_power="
        f"{optimizer.learning_rate_power}; it must be <= 0 (-0.5 is the "
        "default, 0 a fixed learning rate)."
      )
    for attr in (
      "l1_regularization_strength",
      "l2_regularization_strength",
      "beta",
    ):
      if getattr(optimizer, attr) < 0:
        raise UnsupportedConfigError(
          f"table {table_name!r}: FTRL {attr}={getattr(optimizer, attr)}; "
          "it must be >= 0."
        )


def zero_gradient_is_identity(optimizer: Any) -> bool:
  """Whether a row updated with gradient 0 keeps its values and slots.

  True for SGD and Adagrad without weight decay or weight clipping, whose
  gradient clipping keeps 0 at 0: an update may then leave out the rows no
  gradient reaches (`backends.gradient_rows`). False where a zero gradient
  still moves a row: Adam's and AdagradMomentum's decaying moments, FTRL's
  weights recomputed from its slots, decay, clipping into a range.
  """
  if _update_fn(optimizer) not in (_sgd, _adagrad):
    return False
  lo, hi = optimizer.clip_gradient_min, optimizer.clip_gradient_max
  return (
    not optimizer.weight_decay_factor
    and optimizer.clip_weight_min is None
    and optimizer.clip_weight_max is None
    and (lo is None or lo <= 0)
    and (hi is None or hi >= 0)
  )


def learning_rate(optimizer: Any) -> tf.Tensor:
  """The optimizer's current learning rate as a float32 scalar.

  A callable `learning_rate` is called on every use (inside `tf.function` it
  is traced, so it should read variables such as the step counter).
  """
  lr = optimizer.learning_rate
  if callable(lr):
    lr = lr()
  return tf.cast(lr, tf.float32)


# -- per-optimizer row updates -------------------------------------------------
#
# Each takes (optimizer, lr, w [U, D], slot rows {name: [U, D]}, g [U, D]) after
# gradient clipping and weight decay, and returns the new (w, slot rows).


def _divide(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
  """`x / y` for `y > 0`, correctly rounded in eager, graph and XLA code.

  Inside a `tf.function` TF's graph optimizer (and XLA) rewrite
  `x / tf.sqrt(y)` into `x * rsqrt(y)`, and TF's CPU rsqrt is neither
  correctly rounded nor the same in a SIMD lane and the scalar tail: an
  update then depended on how many rows one call updated (issue 52).
  `divide_no_nan` is not rewritten, and equals `x / y` wherever `y != 0`.
  """
  return tf.math.divide_no_nan(x, y)


def _sgd(opt, lr, w, s, g):
  del opt
  return w - lr * g, s


def _adagrad(opt, lr, w, s, g):
  del opt
  acc = s["accumulators"] + g * g
  return w - _divide(lr * g, tf.sqrt(acc)), {"accumulators": acc}


def _adagrad_momentum(opt, lr, w, s, g):
  g2 = g * g
  if opt.beta2 == 1:
    acc = s["accumulators"] + g2
  else:
    acc = opt.beta2 * s["accumulators"] + (1.0 - opt.beta2) * g2
  if opt.exponent == 2:  # TF's default: a square root, correctly rounded
    scaled = _divide(g, tf.sqrt(acc + opt.epsilon))
  else:  # tf.pow: within ~1 ulp, rounded as the call's size falls
    scaled = tf.pow(acc + opt.epsilon, -1.0 / opt.exponent) * g
  m = opt.momentum * s["momenta"] + scaled
  u = opt.momentum * m + scaled if opt.use_nesterov else m
  return w - lr * u, {"accumulators": acc, "momenta": m}


def _adam(opt, lr, w, s, g):
  m = opt.beta_1 * s["momenta"] + (1.0 - opt.beta_1) * g
  v = opt.beta_2 * s["velocities"] + (1.0 - opt.beta_2) * g * g
  if opt.sum_inside_sqrt:
    step = _divide(m, tf.sqrt(v + opt.epsilon * opt.epsilon))
  else:
    step = _divide(m, tf.sqrt(v) + opt.epsilon)
  return w - lr * step, {"momenta": m, "velocities": v}


def _power(n: tf.Tensor, exponent: float) -> tf.Tensor:
  """`n ** exponent`, with the common square root exact at 0."""
  if exponent == 0.5:
    return tf.sqrt(n)
  return tf.pow(n, exponent)


def _ftrl(opt, lr, w, s, g):
  n, z = s["accumulators"], s["linears"]
  l1 = opt.l1_regularization_strength
  l2 = opt.l2_regularization_strength
  n_new = n + g * g
  p_new = _power(n_new, -opt.learning_rate_power)
  sigma = p_new - _power(n, -opt.learning_rate_power)
  if opt.multiply_linear_by_learning_rate:
    # `linears` holds z * lr (TF's ApplyFtrl(multiply_linear_by_lr=True)).
    z = z + lr * g - sigma * w
    l1_eff = l1 * lr
    denominator = p_new + 2.0 * l2 * lr + opt.beta
  else:
    z = z + g - sigma / lr * w
    l1_eff = tf.constant(l1, tf.float32)
    denominator = (p_new + opt.beta) / lr + 2.0 * l2
  numerator = tf.clip_by_value(z, -l1_eff, l1_eff) - z  # 0 where |z| <= l1
  if opt.allow_zero_accumulator:
    w = tf.math.divide_no_nan(numerator, denominator)
  else:
    w = numerator / denominator
  return w, {"accumulators": n_new, "linears": z}


_UPDATES: dict[type, _UpdateFn] = {
  embedding.SGD: _sgd,
  embedding.Adagrad: _adagrad,
  embedding.AdagradMomentum: _adagrad_momentum,
  embedding.Adam: _adam,
  embedding.FTRL: _ftrl,
}
_SUPPORTED = ", ".join(sorted(cls.__name__ for cls in _UPDATES))


def _update_fn(opt) -> _UpdateFn | None:
  """The row update of `opt`'s class or of its nearest supported base class."""
  for cls in type(opt).__mro__:
    if cls in _UPDATES:
      return _UPDATES[cls]
  return None


# -- the pipeline --------------------------------------------------------------


def _clip(x: tf.Tensor, lo, hi) -> tf.Tensor:
  if lo is not None:
    x = tf.maximum(x, lo)
  if hi is not None:
    x = tf.minimum(x, hi)
  return x


def _decay(opt, lr: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
  if not opt.weight_decay_factor:
    return w
  d = opt.weight_decay_factor
  if opt.multiply_weight_decay_factor_by_learning_rate:
    d = d * lr
  return w - d * w


def _step(
  opt, lr: tf.Tensor, w: tf.Tensor, s: _Rows, g: tf.Tensor
) -> tuple[tf.Tensor, _Rows]:
  """Steps 2-4 (decay, update, weight clipping) on rows, g already clipped."""
  w = _decay(opt, lr, w)
  update = _update_fn(opt)
  assert update is not None, "checked when the optimizer was accepted"
  w, s = update(opt, lr, w, s, g)
  return _clip(w, opt.clip_weight_min, opt.clip_weight_max), s


def _check_args(optimizer, table, slots: Mapping[str, Any], ids, grads):
  name = getattr(table, "name", "<table>")
  _validate(optimizer, name)
  expected = _tf_internal.slot_names(optimizer)
  missing = [n for n in expected if n not in slots]
  if missing:
    raise ValueError(
      f"table {name!r}: {type(optimizer).__name__} needs slot variables "
      f"{expected}; missing {missing}, got {sorted(slots)}."
    )
  if ids.shape.rank is not None and ids.shape.rank != 1:
    raise ValueError(
      f"table {name!r}: ids must be a vector [U] of unique row "
      f"ids; got shape {ids.shape}."
    )
  if grads.shape.rank is not None and grads.shape.rank != 2:
    raise ValueError(
      f"table {name!r}: grads must be [U, D]; got shape {grads.shape}."
    )
  dim = table.shape[-1] if table.shape.rank else None
  if dim is not None and grads.shape[-1] is not None and grads.shape[-1] != dim:
    raise ValueError(
      f"table {name!r}: grads have dimension {grads.shape[-1]}, "
      f"the table has dimension {dim} (grads shape "
      f"{grads.shape}, table shape {table.shape})."
    )
  if ids.dtype not in (tf.int32, tf.int64):
    raise TypeError(
      f"table {name!r}: ids must be int32 or int64; got {ids.dtype.name}."
    )


def apply_sparse_update(
  optimizer: Any,
  table: tf.Variable,
  slots: dict[str, tf.Variable],
  ids: tf.Tensor,
  grads: tf.Tensor,
  rows: tf.Tensor | None = None,
  keep: tf.Tensor | None = None,
  rounding: narrow.Rounding | None = None,
) -> None:
  """Applies one step of `optimizer` (TPU semantics) to the rows `ids`.

  Applies gradient clipping, weight decay, the optimizer's update and weight
  clipping, in that order, to the rows `ids` of `table` and of each slot
  variable. Rows not in `ids` are untouched, except with non-lazy Adam
  (`lazy_adam=False`), which updates every row, with `g = 0` for the rows not
  in `ids`.

  Call it once per table per step. It reads and writes only through the
  variables' handles, so `table` and `slots` may be `MirroredVariable`s used in
  replica context (inside `strategy.run`), where each replica updates its own
  copy with the same `ids` and `grads`.

  Args:
    optimizer: a `tf.tpu.experimental.embedding` optimizer (SGD, Adagrad,
      AdagradMomentum, Adam, FTRL); a callable `learning_rate` is evaluated
      once per call.
    table: the table variable, `[V, D]` float32, or bfloat16/float16 (a
      narrow table, `backends.storage.narrow`: the math runs in float32 and the
      new rows are rounded back, stochastically with `rounding`, else to
      nearest; a finite value beyond the dtype's range saturates to its
      largest finite value, counted by `rounding`).
    slots: the table's slot variables keyed by TF's slot names (see
      `slot_names`), each `[V, D]`.
    ids: int32/int64 `[U]`, the UNIQUE row ids touched this step (duplicates
      give undefined results).
    grads: float32 `[U, D]`, the gradient of each row, already summed over
      every occurrence in the global batch (all replicas).
    rows: optional float32 `[U, D]`, the current values `table[ids]` if the
      caller has just read them (e.g. the lookup of the same step, when
      nothing wrote to the table since): saves one gather of the table. The
      caller vouches that they are current.
    keep: optional bool scalar; False writes the rows back unchanged. For
      fixed-size steps (`backends.static_bags`) whose `ids` may hold no real
      row at all. Duplicate ids are allowed when their `grads` (and `rows`)
      are equal too: each computes the same new row. Ignored by non-lazy
      Adam, which updates every row every step.
    rounding: a narrow table's stochastic rounding (None: to nearest).

  Raises:
    UnsupportedConfigError: the optimizer is not supported (see
      `check_supported`).
    ValueError: a slot is missing, or `ids` / `grads` have the wrong shape.
    TypeError: `ids` is not an integer tensor.
  """
  ids = tf.convert_to_tensor(ids)
  compute = narrow.math_dtype(table.dtype)
  grads = tf.cast(tf.convert_to_tensor(grads), compute)
  _check_args(optimizer, table, slots, ids, grads)
  lr = learning_rate(optimizer)
  names = _tf_internal.slot_names(optimizer)

  if isinstance(optimizer, embedding.Adam) and not optimizer.lazy_adam:
    # Dense: every row, g = 0 (then clipped, like any gradient) where untouched.
    w = tf.cast(
      tf.raw_ops.ReadVariableOp(resource=table.handle, dtype=table.dtype),
      compute,
    )
    s = {
      n: tf.raw_ops.ReadVariableOp(
        resource=slots[n].handle, dtype=slots[n].dtype
      )
      for n in names
    }
    dense_g = tf.tensor_scatter_nd_update(
      tf.zeros_like(w), tf.expand_dims(ids, 1), grads
    )
    dense_g = _clip(
      dense_g, optimizer.clip_gradient_min, optimizer.clip_gradient_max
    )
    w, s = _step(optimizer, lr, w, s, dense_g)
    every = tf.range(tf.shape(w, out_type=tf.int64)[0])
    tf.raw_ops.AssignVariableOp(
      resource=table.handle, value=_narrowed(table, every, w, rounding)
    )
    for n in names:
      tf.raw_ops.AssignVariableOp(resource=slots[n].handle, value=s[n])
    return

  g = _clip(grads, optimizer.clip_gradient_min, optimizer.clip_gradient_max)
  w = _read_rows(table, ids, rows)
  s = {
    n: tf.raw_ops.ResourceGather(
      resource=slots[n].handle, indices=ids, dtype=slots[n].dtype
    )
    for n in names
  }
  w, s = _kept(keep, _step(optimizer, lr, w, s, g), (w, s))
  tf.raw_ops.ResourceScatterUpdate(
    resource=table.handle,
    indices=ids,
    updates=_narrowed(table, ids, w, rounding),
  )
  for n in names:
    tf.raw_ops.ResourceScatterUpdate(
      resource=slots[n].handle, indices=ids, updates=s[n]
    )


def _read_rows(
  table: tf.Variable, ids: tf.Tensor, rows: tf.Tensor | None
) -> tf.Tensor:
  """The rows `ids` of `table` (or the given current `rows`) in the
  optimizer's math dtype (float32 for a narrow table)."""
  compute = narrow.math_dtype(table.dtype)
  if rows is not None:
    return tf.cast(rows, compute)
  return tf.cast(
    tf.raw_ops.ResourceGather(
      resource=table.handle, indices=ids, dtype=table.dtype
    ),
    compute,
  )


def _narrowed(
  table: tf.Variable,
  ids: tf.Tensor,
  w: tf.Tensor,
  rounding: narrow.Rounding | None,
) -> tf.Tensor:
  """New rows `w` in the table's dtype: a narrow table's stochastically
  rounded with `rounding` (to nearest without one), saturated at its range
  (`backends.storage.narrow`; counted by `rounding`)."""
  if not narrow.is_narrow(table.dtype):
    return w
  if rounding is None:
    return narrow.cast(w, table.dtype)
  return rounding.round(w, table.dtype, ids)


def _kept(
  keep: tf.Tensor | None,
  new: tuple[tf.Tensor, _Rows],
  old: tuple[tf.Tensor, _Rows],
) -> tuple[tf.Tensor, _Rows]:
  """`new` rows where `keep` (a scalar or one flag per row), else `old`."""
  if keep is None:
    return new
  if keep.shape.rank == 1:
    keep = keep[:, tf.newaxis]

  def pick(n, o):
    return tf.where(keep, n, o)

  return pick(new[0], old[0]), {
    k: pick(v, old[1][k]) for k, v in new[1].items()
  }


class SparseUpdate(NamedTuple):
  """One table's part of `apply_sparse_updates` (see `apply_sparse_update`)."""

  table: tf.Variable
  slots: dict[str, tf.Variable]
  ids: tf.Tensor
  grads: tf.Tensor
  rows: tf.Tensor | None = None
  keep: tf.Tensor | None = None
  rounding: narrow.Rounding | None = None


# The optimizers the fused kernel (backends/tensorcore/kernels,
# RecsysSparseApply) implements, by the name of its `optimizer` attribute.
_FUSED = {
  embedding.SGD: "sgd",
  embedding.Adagrad: "adagrad",
  embedding.Adam: "adam",
}


def fused_attrs(optimizer: Any) -> dict[str, Any] | None:
  """`RecsysSparseApply`'s attributes for `optimizer`, or None if it has none.

  The fused kernel implements SGD, Adagrad and lazy Adam (with clipping and
  weight decay), exactly as `apply_sparse_update`; other optimizers, and
  subclasses that override the math, stay on the TF ops.
  """
  name = _FUSED.get(type(optimizer))
  if name is None or (name == "adam" and not optimizer.lazy_adam):
    return None
  inf = float("inf")

  def bound(value, default):
    return default if value is None else float(value)

  attrs = dict(
    optimizer=name,
    clip_gradient_min=bound(optimizer.clip_gradient_min, -inf),
    clip_gradient_max=bound(optimizer.clip_gradient_max, inf),
    clip_weight_min=bound(optimizer.clip_weight_min, -inf),
    clip_weight_max=bound(optimizer.clip_weight_max, inf),
    weight_decay=float(optimizer.weight_decay_factor or 0.0),
    decay_by_lr=bool(optimizer.multiply_weight_decay_factor_by_learning_rate),
  )
  if name == "adam":
    # 1 - beta and eps * eps in double, then float32, as `_adam`'s constants.
    attrs.update(
      beta_1=float(optimizer.beta_1),
      beta_2=float(optimizer.beta_2),
      epsilon=float(optimizer.epsilon),
      one_minus_beta_1=1.0 - optimizer.beta_1,
      one_minus_beta_2=1.0 - optimizer.beta_2,
      epsilon_squared=optimizer.epsilon * optimizer.epsilon,
      sum_inside_sqrt=bool(optimizer.sum_inside_sqrt),
    )
  return attrs


def apply_sparse_updates(
  optimizer: Any,
  updates: Sequence[SparseUpdate],
  fused_ops: Any = None,
) -> None:
  """`apply_sparse_update` for several tables that share `optimizer`.

  Each table's rows are read and written separately, but the optimizer's
  element-wise math runs once on the rows of all tables stacked (same
  formulas, element by element, so the same numbers as one call per table),
  which saves per-op overhead when many small tables share an optimizer.
  Tables of different dimensions or dtypes, and non-lazy Adam (dense), are
  updated one by one.

  Args:
    optimizer: the `tf.tpu.experimental.embedding` optimizer of every table.
    updates: one `SparseUpdate` per table; each table appears once.
    fused_ops: the fused kernels' module (`backends.tensorcore.kernels.load()`):
      tables whose optimizer it implements (`fused_attrs`) are updated in place
      by one `RecsysSparseApply` each (float32, or narrow with their
      `rounding`, bit-identical to the TF ops, the values they saturate
      counted alike). The variables must be on the CPU, outside XLA.
  """
  attrs = fused_attrs(optimizer) if fused_ops else None
  if attrs is not None:
    names = _tf_internal.slot_names(optimizer)
    lr = learning_rate(optimizer)
    rest = []
    for u in updates:
      if not _fused_dtype(u.table, u.rounding):
        rest.append(u)
        continue
      ids = tf.convert_to_tensor(u.ids)
      grads = tf.cast(tf.convert_to_tensor(u.grads), tf.float32)
      _check_args(optimizer, u.table, u.slots, ids, grads)
      saturated = fused_ops.recsys_sparse_apply(
        table=u.table.handle,
        slots=[u.slots[n].handle for n in names],
        ids=tf.cast(ids, tf.int64),
        grads=grads,
        learning_rate=lr,
        **_rounding_args(u.rounding),
        **attrs,
      )
      if u.rounding is not None:
        u.rounding.record_kernel(saturated)
    updates = rest
    if not updates:
      return
  dims = {(u.table.dtype, u.table.shape[-1]) for u in updates}
  dense_adam = isinstance(optimizer, embedding.Adam) and not optimizer.lazy_adam
  if (
    len(updates) < 2
    or len(dims) > 1
    or dense_adam
    or None in {d for _, d in dims}
  ):
    for u in updates:
      apply_sparse_update(
        optimizer,
        u.table,
        u.slots,
        u.ids,
        u.grads,
        rows=u.rows,
        keep=u.keep,
        rounding=u.rounding,
      )
    return
  names = _tf_internal.slot_names(optimizer)
  ws: list[tf.Tensor] = []
  gs: list[tf.Tensor] = []
  idss: list[tf.Tensor] = []
  ss: dict[str, list[tf.Tensor]] = {n: [] for n in names}
  for u in updates:
    ids = tf.convert_to_tensor(u.ids)
    grads = tf.cast(
      tf.convert_to_tensor(u.grads), narrow.math_dtype(u.table.dtype)
    )
    _check_args(optimizer, u.table, u.slots, ids, grads)
    idss.append(ids)
    gs.append(grads)
    ws.append(_read_rows(u.table, ids, u.rows))
    for n in names:
      ss[n].append(
        tf.raw_ops.ResourceGather(
          resource=u.slots[n].handle, indices=ids, dtype=u.slots[n].dtype
        )
      )
  sizes = [tf.shape(i)[0] for i in idss]
  g = _clip(
    tf.concat(gs, 0), optimizer.clip_gradient_min, optimizer.clip_gradient_max
  )
  old = (tf.concat(ws, 0), {n: tf.concat(ss[n], 0) for n in names})
  keep = None
  if any(u.keep is not None for u in updates):
    keep = tf.concat(
      [
        tf.fill([size], tf.constant(True) if u.keep is None else u.keep)
        for u, size in zip(updates, sizes)
      ],
      0,
    )
  w, s = _kept(keep, _step(optimizer, learning_rate(optimizer), *old, g), old)
  new_w = tf.split(w, sizes)
  new_s = {n: tf.split(s[n], sizes) for n in names}
  for k, u in enumerate(updates):
    tf.raw_ops.ResourceScatterUpdate(
      resource=u.table.handle,
      indices=idss[k],
      updates=_narrowed(u.table, idss[k], new_w[k], u.rounding),
    )
    for n in names:
      tf.raw_ops.ResourceScatterUpdate(
        resource=u.slots[n].handle, indices=idss[k], updates=new_s[n][k]
      )


def apply_bag_update(
  optimizer: Any,
  table: tf.Variable,
  slots: dict[str, tf.Variable],
  unique_ids: tf.Tensor,
  index: tf.Tensor,
  grads: tf.Tensor,
  flat_segments: tf.Tensor,
  scale: tf.Tensor | None,
  fused_ops: Any,
  concurrent_calls: int = 0,
  rounding: narrow.Rounding | None = None,
) -> bool:
  """The rows' gradients and their update, in one `RecsysBagApply` call.

  The backward pass of a fused `_bags.lookup` and the update of its unique
  rows: the same float32 operations, in the same order, as
  `_bags.row_gradients` followed by `apply_sparse_updates`.

  Args:
    optimizer: the table's embedding optimizer.
    table: the table variable (float32, or narrow with `rounding`); `slots`
      its slot variables by name.
    unique_ids: int64 `[U]` and `index` int32 `[N]`, from the fused
      `_bags.lookup` of this step (`unique_ids` distinct).
    grads: `[sum_f S_f, D]`, the features' activation gradients stacked.
    flat_segments: int32 `[N]`, each id's activation row; `scale` as in
      `_bags.row_gradients`.
    fused_ops: the fused kernels' module.
    concurrent_calls: as in `_bags.lookup`.
    rounding: a narrow table's stochastic rounding (the kernel draws the
      same bits as `narrow.Rounding.round`, saturates and counts alike).

  Returns:
    False (nothing done) when the kernel does not implement the optimizer,
    or the table is narrow without a rounding: the caller updates the table
    otherwise.
  """
  attrs = fused_attrs(optimizer)
  if attrs is None or not _fused_dtype(table, rounding):
    return False
  _check_args(optimizer, table, slots, unique_ids, grads)
  names = _tf_internal.slot_names(optimizer)
  saturated = fused_ops.recsys_bag_apply(
    table=table.handle,
    slots=[slots[n].handle for n in names],
    unique_ids=unique_ids,
    grads=tf.cast(grads, tf.float32),
    index=index,
    segments=flat_segments,
    scale=_bags.scale_or_empty(scale),
    learning_rate=learning_rate(optimizer),
    concurrent_calls=concurrent_calls,
    **_rounding_args(rounding),
    **attrs,
  )
  if rounding is not None:
    rounding.record_kernel(saturated)
  return True


def _fused_dtype(table: tf.Variable, rounding: narrow.Rounding | None) -> bool:
  """Whether the fused kernels update `table`: float32, or narrow with its
  stochastic rounding keyed by the table's own row ids (to-nearest narrow
  updates and a shard's rounding, keyed by global ids, stay on the TF ops)."""
  if narrow.is_narrow(table.dtype):
    return rounding is not None and rounding.fused
  return table.dtype == tf.float32


def _rounding_args(rounding: narrow.Rounding | None) -> dict[str, Any]:
  """The kernels' `rounding_step` input and `rounding_seed` attribute: the
  update's step (advancing the counter, as `Rounding.round` does)."""
  if rounding is None:
    return dict(rounding_step=tf.constant(0, tf.int64), rounding_seed=0)
  return dict(rounding_step=rounding.next_step(), rounding_seed=rounding.seed)
