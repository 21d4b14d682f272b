"""The dynamic engine: flat bags of any size; fused CPU kernels or TF ops.

Every feature becomes `FlatBags` (`backends.inputs`), validated with the id
policy; a table's features are looked up as one flat bag (`backends._bags`):
one de-duplication, one read of each unique row, one segment sum into the
activations of every feature stacked in feature order. On CPU-only hosts
outside XLA the fused C++ kernels (`backends.tensorcore.kernels`) flatten padded
bags, de-duplicate and sum in one pass over a table read in place, compute the
rows' gradients and, when the table is this replica's alone, apply the
optimizer in the same pass. Tables whose rows live elsewhere (row-sharded,
on parameter servers) are read through their storage.

Example:
  >>> engine = DynamicEngine(features,
  kernels=backends.tensorcore.kernels.load())
  >>> outputs, steps = engine.lookup(flat, flat_w, None, storages, True)
"""

from typing import Any

import tensorflow as tf

from backends import _bags, _tf_internal, optimizers, quantization
from backends import input_checks as checks_lib
from backends import inputs as inputs_lib
from backends.storage.base import TableStorage
from backends.table_step import Features, TableStep
from backends.tensorcore.engines import base


class _Backward:
  """The dynamic lookup's record for the rows' gradients of one table."""

  def __init__(
    self,
    flat: _bags.TableBag,
    index: tf.Tensor,
    bags: list[inputs_lib.FlatBags],
  ):
    self.index = index  # int32 [N]: each id's unique row
    self.segments = flat.segments  # int32 [N]: each id's activation row
    self.scale = flat.scale  # float32 [N] or None
    self.sizes = flat.sizes  # per feature: S_f
    self.bags = bags  # the table's features, in order (their ids: `index`)


class DynamicEngine(base.Engine):
  """Flat bags of any size, with the fused kernels when they can run.

  Args:
    features: the backend's features and tables.
    kernels: the fused kernels' module (`backends.tensorcore.kernels.load()`),
      or None for TF ops only.
    concurrent_calls: how many fused calls of one kind a step runs side by
      side (tables x replicas), for the kernels' threading.
  """

  def __init__(
    self, features: Features, kernels: Any = None, concurrent_calls: int = 0
  ):
    super().__init__(features)
    self._kernels = kernels
    self._concurrent_calls = concurrent_calls
    self.name = "fused" if kernels is not None else "tf_ops"

  def _fused(self) -> Any | None:
    """The kernels if this trace can run them (not inside XLA)."""
    if self._kernels is None or _tf_internal.in_xla_context():
      return None
    return self._kernels

  def update_kernels(self) -> Any | None:
    return self._fused()

  # -- inputs ---------------------------------------------------------------

  def bags(
    self,
    flat: list[Any],
    flat_weights: list[Any],
    counters: Any,
    fused_ops: Any | None,
  ) -> list[inputs_lib.FlatBags]:
    """Every feature's input as validated flat bags, in config order.

    Counts invalid and truncated ids in `counters` (per-replica sums; None:
    nothing counted). `fused_ops`: flatten padded bags in one op.
    """
    features = self.features
    # In a graph the fused op that flattens padded bags checks their ids
    # itself (same message): six ops per feature fewer; or, with the "drop"
    # policy, leaves the ids outside the table out: three boolean masks
    # fewer. Eagerly the Python check raises its InvalidInputError.
    kernel_checks = fused_ops is not None and not tf.executing_eagerly()
    out = []
    checks = checks_lib.CheckGroup()  # one assertion for every feature
    for layout, inp, w in zip(features.layouts, flat, flat_weights):
      policy = features.id_policy(layout)
      bag = inputs_lib.to_flat_bags(
        layout,
        inp,
        w,
        features.bag_widths[layout.path],
        fused_ops=fused_ops,
        check_ids=kernel_checks
        and policy == "error"
        and layout.feature.validate_weights_and_indices,
        drop_ids=kernel_checks
        and policy == "drop"
        and layout.feature.validate_weights_and_indices,
      )
      if layout.feature.validate_weights_and_indices:
        with checks:
          bag, num_invalid = inputs_lib.validate(layout, bag, policy)
        if counters is not None and policy != "error":
          counters.invalid[layout.path].assign_add(num_invalid)
      if counters is not None and features.width(layout):
        counters.truncated[layout.path].assign_add(bag.truncated)
      out.append(bag)
    return base.after_checks(checks, out)

  # -- lookup ---------------------------------------------------------------

  def lookup(
    self,
    flat: list[Any],
    flat_weights: list[Any],
    counters: Any,
    storages: dict[str, TableStorage],
    training: bool,
  ) -> tuple[list[tf.Tensor], dict[str, TableStep]]:
    # Training steps only: lookups for evaluation or export stay TF ops
    # (a SavedModel must not need this library).
    fused = self._fused() if training else None
    bags = self.bags(flat, flat_weights, counters, fused)
    outputs: list[Any] = [None] * len(bags)
    steps = {}
    for table, name in self.features.tables:
      storage = storages[name]
      positions = self.features.positions_of(name)
      table_bags = [bags[i] for i in positions]
      capacity = _capacity(table, table_bags)
      # All features of the table as one flat bag: one de-duplication, one
      # read of the unique rows ([U, D]; a tape on a local table sees
      # gradient IndexedSlices of U rows), one segment sum into the
      # activations of every feature stacked in feature order.
      flat_bag = _bags.concat_bags(table_bags, table.combiner)
      # The fused kernels read a narrow table's rows too; the TF ops take
      # the local float32 table, or `gather` (which upcasts narrow rows).
      local = (
        storage.kernel_variables()
        if fused is not None
        else storage.local_variables()
      )
      exchanged: list[Any] = [None]
      # The ids a replica may send: static, else known when the step runs.
      size = capacity
      if size is None:
        size = _slots(table, table_bags)

      def gather_rows(
        params, ids, storage=storage, exchanged=exchanged, size=size
      ):
        del params
        rows, exchanged[0] = storage.gather(ids, None, size)
        return rows

      found = _bags.lookup(
        flat_bag,
        local["parameters"] if local is not None else None,
        gather_rows,
        fused,
        self._concurrent_calls,
        quantization.quantizer(table),
        num_rows=table.vocabulary_size,
      )
      for i, bag, out in zip(
        positions, table_bags, _bags.split_features(found.acts, flat_bag)
      ):
        outputs[i] = self.features.shape_output(i, bag.sequence_length, out)
      if training:
        steps[name] = TableStep(
          positions,
          found.unique_ids,
          None,
          capacity,
          found.rows,
          _Backward(flat_bag, found.index, table_bags),
          exchanged[0],
        )
    return outputs, steps

  # -- gradients ------------------------------------------------------------

  def _activation_gradients(self, table, step: TableStep, flat_grads):
    """The table's features' activation gradients stacked: `[sum S_f, D]`."""
    grads = base.activation_gradients(
      table, step.positions, step.backward.sizes, flat_grads
    )
    return tf.concat(grads, 0) if len(grads) > 1 else grads[0]

  def row_gradients(
    self, table: Any, step: TableStep, flat_grads: list[Any]
  ) -> tf.Tensor:
    back = step.backward
    return _bags.row_gradients(
      self._activation_gradients(table, step, flat_grads),
      back.index,
      back.segments,
      back.scale,
      tf.size(step.ids, out_type=tf.int32),
      self._fused(),
    )

  def ids_by_feature(self, step: TableStep) -> list:
    back = step.backward
    # The flat bag holds each feature's ids in turn.
    counts = [tf.size(b.ids, out_type=tf.int32) for b in back.bags]
    parts = tf.split(back.index, counts) if len(counts) > 1 else [back.index]
    return [(p, None, b.capacity) for p, b in zip(parts, back.bags)]

  def apply_in_place(
    self,
    table: Any,
    step: TableStep,
    flat_grads: list[Any],
    storage: TableStorage,
    optimizer: Any,
  ) -> bool:
    """The fused lookup's backward pass and update: one kernel call."""
    fused = self._fused()
    local = storage.kernel_variables()
    if (
      fused is None
      or local is None
      or step.rows is not None
      or not storage.updates_alone()
    ):
      return False
    back = step.backward
    return optimizers.apply_bag_update(
      optimizer,
      local["parameters"],
      {k: v for k, v in local.items() if k != "parameters"},
      step.ids,
      back.index,
      self._activation_gradients(table, step, flat_grads),
      back.segments,
      back.scale,
      fused,
      self._concurrent_calls,
      storage.rounding,
    )


def _slots(table: Any, bags: list[inputs_lib.FlatBags]) -> tf.Tensor:
  """A bound on the table's unique ids known when the step runs.

  From the inputs' shapes (batch size times width: the same in every step
  of a loop over whole, padded batches), else the number of ids.
  """
  total = tf.add_n(
    [b.slots if b.slots is not None else tf.size(b.ids, tf.int64) for b in bags]
  )
  return tf.minimum(total, table.vocabulary_size)


def _capacity(table: Any, bags: list[inputs_lib.FlatBags]) -> int | None:
  """A static bound on the table's unique ids in a step, if known."""
  capacities = [b.capacity for b in bags if b.capacity is not None]
  if len(capacities) != len(bags):
    return None
  return min(sum(capacities), table.vocabulary_size)
