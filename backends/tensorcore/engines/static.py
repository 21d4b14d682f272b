"""The static engine: every shape fixed at trace time, as XLA compiles it.

The lookup of `backends.static_bags` in a step: each feature's ids in slots
of a size fixed by its input's shape, validated without leaving the step
(refused ids are counted, not raised, inside XLA), each table's ids
de-duplicated into a fixed capacity, its rows read through the table's
storage (a fixed-size exchange when the rows live on other replicas), and
combined per feature. Runs compiled (`jit_compile=True`, a TPU) and
uncompiled (several CPU replicas, whose collectives XLA cannot compile), with
the same numbers as the dynamic engine.

Example:
  >>> engine = StaticEngine(features)
  >>> outputs, steps = engine.lookup(flat, flat_w, counters, storages, True)
"""

import functools
import logging
from typing import Any

import tensorflow as tf

from backends import _tf_internal, quantization, static_bags
from backends import input_checks as checks_lib
from backends.storage.base import TableStorage
from backends.table_step import TableStep
from backends.tensorcore.engines import base

log = logging.getLogger("recsys.backends")


class _Backward:
  """The static lookup's record for the rows' gradients of one table."""

  def __init__(self, index: tf.Tensor, bags: list[static_bags.StaticBags]):
    self.index = index  # int32 [N]: each slot's unique slot
    self.bags = bags  # the table's features, in order


class StaticEngine(base.Engine):
  """Static shapes only: the lookup a compiled step (XLA, TPU) runs."""

  name = "static"

  # -- inputs ---------------------------------------------------------------

  def bags(
    self, flat: list[Any], flat_weights: list[Any], counters: Any
  ) -> list[static_bags.StaticBags]:
    """Every feature as validated `StaticBags` with its combiner's scale.

    Refused ids and weights are counted per feature (the counters behind
    `raise_for_invalid_inputs`); outside a compiled step, the "error" policy
    also raises (eagerly) or fails the step (graph) right away.
    """
    features = self.features
    compiled = _tf_internal.in_xla_context()
    out = []
    checks = checks_lib.CheckGroup()  # one assertion for every feature
    for layout, inp, w in zip(features.layouts, flat, flat_weights):
      policy = features.id_policy(layout)
      if not compiled:  # a compiled step cannot raise: it leaves such ids out
        checks_lib.check_bag_structure(checks_lib.describe(layout), inp, w)
      bags = static_bags.from_input(
        layout, inp, w, features.bag_widths[layout.path]
      )
      if layout.feature.validate_weights_and_indices:
        bags, report = static_bags.validate(layout, bags, policy)
        if policy == "error" and not compiled:
          with checks:
            _raise_for_report(layout, report)
        if counters is not None:
          if policy == "error":
            counters.refused_ids[layout.path].assign_add(report.bad_ids)
            example = counters.refused_example[layout.path]
            example.assign(
              tf.where(report.bad_ids > 0, report.example, example.read_value())
            )
          else:
            counters.invalid[layout.path].assign_add(report.bad_ids)
          counters.refused_weights[layout.path].assign_add(report.bad_weights)
      if counters is not None and features.width(layout):
        counters.truncated[layout.path].assign_add(bags.truncated)
      out.append(
        static_bags.with_combiner_scale(bags, layout.feature.table.combiner)
      )
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
    """`lookup` with static shapes only, as XLA and TPUs compile it.

    Each table's ids are de-duplicated into a fixed capacity (the number of
    id slots of its features), its unique rows read once (a tape on a local
    table sees `IndexedSlices` of that fixed size) and combined per feature.
    """
    bags = self.bags(flat, flat_weights, counters)
    outputs: list[Any] = [None] * len(bags)
    steps = {}
    compiled = _tf_internal.in_xla_context()
    for table, name in self.features.tables:
      storage = storages[name]
      positions = self.features.positions_of(name)
      table_bags = [bags[i] for i in positions]
      dynamic = _dynamic_features(self.features, positions, table_bags)
      ids = tf.concat([b.ids for b in table_bags], 0)
      valid = tf.concat([b.valid for b in table_bags], 0)
      dd = static_bags.dedup(ids, valid, table.vocabulary_size)
      capacity = dd.ids.shape[0]
      local = storage.local_variables()
      dense_reason = None
      if local is not None and not training and _tf_internal.tape_may_record():
        # A tape may take the table's gradient (V0's loop with a Keras
        # optimizer on `embedding_tables`).
        replicas = storage.strategy.num_replicas_in_sync
        if dynamic and replicas > 1:
          dense_reason = (
            "ragged/sparse inputs without a static width under several replicas"
          )
        elif compiled:
          dense_reason = (
            "a compiled step (Keras's sparse updates, e.g. "
            "ResourceSparseApplyAdagradV2, have no XLA kernel)"
          )
      exchanged = None
      if dense_reason:
        # What V0 gives on a TPU: a dense gradient of the table, the same
        # shape on every replica, that every Keras optimizer can compile.
        _warn_dense_table_gradient(
          name, table.vocabulary_size, table.dim, dense_reason
        )
        assert local is not None  # a dense_reason needs a local table
        rows = _gather_with_dense_gradient(local["parameters"], dd.ids)
      else:
        real = tf.range(tf.shape(dd.ids)[0]) < dd.num_unique
        rows, exchanged = storage.gather(
          dd.ids, real, capacity or tf.shape(dd.ids)[0]
        )
      sizes = [
        tf.shape(b.ids)[0] if b.capacity is None else b.capacity
        for b in table_bags
      ]
      indices = tf.split(dd.index, sizes) if len(table_bags) > 1 else [dd.index]
      quantize = quantization.quantizer(table)
      combined = rows if quantize is None else quantize(rows)
      for i, bag, index in zip(positions, table_bags, indices):
        acts = static_bags.combine(combined, index, bag)
        outputs[i] = self.features.shape_output(i, bag.sequence_length, acts)
      if training:
        steps[name] = TableStep(
          positions,
          dd.ids,
          dd.num_unique,
          capacity,
          rows,
          _Backward(dd.index, table_bags),
          exchanged,
        )
    return outputs, steps

  # -- gradients ------------------------------------------------------------

  def row_gradients(
    self, table: Any, step: TableStep, flat_grads: list[Any]
  ) -> tf.Tensor:
    back = step.backward
    grads = base.activation_gradients(
      table,
      step.positions,
      [bag.num_segments for bag in back.bags],
      flat_grads,
    )
    return static_bags.pad_rows(
      static_bags.row_gradients(
        grads, back.bags, back.index, tf.shape(step.ids)[0]
      ),
      step.num_unique,
    )

  def ids_by_feature(self, step: TableStep) -> list:
    bags = step.backward.bags
    # The slots hold each feature's ids in turn (static sizes).
    sizes = [
      tf.shape(b.ids)[0] if b.capacity is None else b.capacity for b in bags
    ]
    parts = tf.split(step.backward.index, sizes)
    return [(p, b.valid, b.capacity) for p, b in zip(parts, bags)]

  def check_update(
    self, name: str, step: TableStep, storage: TableStorage
  ) -> None:
    """Refuses a replicated update over replicas without static sizes."""
    if not storage.update_exchanges() or step.exchanged is not None:
      return  # the lookup's exchange sized it (row-sharded)
    dynamic = _dynamic_features(
      self.features, step.positions, step.backward.bags
    )
    if dynamic:
      raise static_bags.StaticShapeError(
        f"table {name!r}: feature(s) {dynamic} have no static number of "
        "ids (a batch of unknown size, or a sparse/ragged feature without "
        "a static width), so the rows that replicas exchange have no fixed "
        "size; batch with drop_remainder=True, and give sparse/ragged "
        "features the backend's bag_widths option (then preprocess() in "
        "the input pipeline)."
      )


def _dynamic_features(features, positions: list[int], bags: list) -> list:
  """The paths of the features whose number of id slots is not static."""
  return [
    features.layouts[p].path
    for p, b in zip(positions, bags)
    if b.capacity is None
  ]


def _raise_for_report(layout, report: static_bags.Report) -> None:
  """Checks of a report's refused ids and weights: they raise eagerly; in a
  graph the caller's `CheckGroup` collects them into its assertion."""
  what = checks_lib.template_safe(checks_lib.describe(layout))
  checks_lib.check_ids_in_range(
    layout,
    tf.equal(report.bad_ids, 0),
    lambda: [report.example[0], report.example[1]],
  )
  checks_lib.check(
    tf.equal(report.bad_weights, 0),
    what + " got {} weights that are NaN, infinite or negative; weights "
    "must be finite and >= 0.",
    lambda: [report.bad_weights],
  )


def _gather_with_dense_gradient(
  params: tf.Variable, ids: tf.Tensor
) -> tf.Tensor:
  """`params[ids]` whose gradient for the table is a dense `[V, D]` tensor."""
  vocab = params.shape[0]

  @tf.custom_gradient
  def gather(table):
    def grad(upstream):
      return tf.math.unsorted_segment_sum(upstream, ids, vocab)

    return tf.gather(table, ids), grad

  return gather(tf.convert_to_tensor(params))


@functools.cache
def _warn_dense_table_gradient(
  table_name: str, vocab: int, dim: int, reason: str
) -> None:
  log.warning(
    "table %r: a tape on the table in %s: its gradient is a dense [%d, %d] "
    "tensor (%.1f MB per step, all-reduced over replicas), as TF's "
    "TPUEmbeddingV0 gives it on a TPU. Train the tables with "
    "lookup(..., training=True) and apply_gradients() (the backend's "
    "sparse update, TPU optimizer math), with bag_widths= and preprocess() "
    "in the input pipeline, to update only the rows a step touched.",
    table_name,
    reason,
    vocab,
    dim,
    vocab * dim * 4 / 1e6,
  )
