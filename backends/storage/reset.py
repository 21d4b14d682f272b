"""What a row a dynamic-vocabulary table gives to a new id starts from.

A reused row must inherit nothing of its previous owner: its values and
every optimizer slot start again from the table's initial values. Every
storage that holds a dynamic table (replicated, row-sharded, on parameter
servers) and the `tpu_embedding_v0` backend (TF's variables) reset rows
with these functions.

Example:
  >>> check_resettable(table, "items")           # when built, before work
  >>> values = starting_values(table, Adagrad(0.1), rows)
  >>> values["parameters"].shape, values["accumulators"].shape  # [k, D]
"""

from typing import Any

import tensorflow as tf

from backends import optimizers
from backends.errors import BackendSettingsError
from backends.storage import row_init


def starting_values(
  table: Any, optimizer: Any | None, rows: tf.Tensor
) -> dict[str, tf.Tensor]:
  """`{"parameters" | slot: [k, D] float32}`: the starting values of `rows`
  (int64 `[k]`) in `table` and in every slot of `optimizer` (None: the
  table alone).

  The table's come from its row-keyed initializer (a row's values depend
  on its id alone, `backends.storage.row_init`), or from its initializer
  drawn for `[k, D]` when that is not row-keyable; a slot's from the
  optimizer's slot initializer.
  """
  rows = tf.cast(tf.reshape(rows, [-1]), tf.int64)
  shape = tf.stack([tf.size(rows), table.dim])
  keyed = row_init.RowInitializer.for_table(table)
  if keyed is not None:
    params = keyed.rows(rows)
  else:
    params = table.initializer(shape, dtype=tf.float32)
  values = {"parameters": tf.cast(params, tf.float32)}
  if optimizer is not None:
    # TF's slot initializers are constants (an accumulator's start, or 0):
    # one row's value, broadcast (`shape` is known only in the step).
    for slot, init in optimizers.slot_initializers(optimizer).items():
      values[slot] = tf.broadcast_to(init((1, table.dim), tf.float32), shape)
  return values


def check_resettable(table: Any, name: str) -> None:
  """Raises `BackendSettingsError` naming table `name` if `starting_values`
  cannot give rows known only in a step their starting values: its
  initializer is neither row-keyable nor a function of a shape known only
  then (e.g. a Constant of a whole array). Traces once, computes nothing."""
  if row_init.RowInitializer.for_table(table) is not None:
    return
  spec = tf.TensorSpec([None], tf.int64)
  try:
    tf.function(
      lambda rows: starting_values(table, None, rows), autograph=False
    ).get_concrete_function(spec)
  except Exception as e:  # noqa: BLE001 - the initializer's own error
    initializer = type(table.initializer).__name__
    raise BackendSettingsError(
      f"table {name!r} is dynamic, but its initializer ({initializer}) "
      "cannot give a reused row its starting value for rows known only in "
      f"a step ({type(e).__name__}: {str(e).split('. ')[0][:200]}): use a "
      "row-keyable initializer (uniform, normal, truncated normal, variance "
      "scaling, a constant) or a function of a symbolic shape."
    ) from e


def write_each_copy(
  strategy: tf.distribute.Strategy,
  variable: tf.Variable,
  rows: tf.Tensor,
  values: tf.Tensor,
) -> list[Any]:
  """Writes `values` `[k, D]` (in the variable's dtype) into `rows` of
  every local copy of `variable`, each copy by itself on its device
  (cross-replica context): a
  TPU's mirrored variable has no cross-replica scatter
  (`TPUMirroredVariable.scatter_update` raises NotImplementedError), a
  component variable has."""
  writes = []
  for copy in strategy.experimental_local_results(variable):
    with tf.device(copy.device):
      writes.append(copy.scatter_update(tf.IndexedSlices(values, rows)))
  return writes
