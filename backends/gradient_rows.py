"""The rows a step's gradients reach: an exchanged update sends only those.

A table's training lookup reads the rows of all its features, but a
feature whose activation gradient is None (the loss reads it under
`stop_gradient`, or not at all: iALS's histories) adds nothing to any row.
Where the update exchanges rows between replicas (a replicated table's
rows summed over the replicas, a row-sharded table's sent to their
owners), those rows' zero gradients would cost bytes and work in
proportion to every id looked up. When the table's optimizer leaves a row
with a zero gradient as it is (`optimizers.zero_gradient_is_identity`),
the update keeps only the rows some gradient reaches: the same tables and
slots afterwards, in a buffer bounded by the id slots of the features that
have gradients.

Example:
  >>> reached = gradient_rows.reached(trained_index, num_rows, bound=4096)
  >>> step, grads = gradient_rows.compact(step, row_grads, reached)
"""

import dataclasses

import tensorflow as tf

from backends import static_bags
from backends.table_step import TableStep


@dataclasses.dataclass(frozen=True)
class Reached:
  """Which of a step's unique rows a gradient reaches.

  Attributes:
    mask: bool `[U]`, per unique row of the step.
    bound: a static bound on how many are True (the id slots of the
      features with gradients), or None when those have no static size.
  """

  mask: tf.Tensor
  bound: int | None


def reached(
  index: tf.Tensor,
  num_rows: tf.Tensor,
  bound: int | None,
  valid: tf.Tensor | None = None,
) -> Reached:
  """`Reached` from the ids of the features that have gradients.

  Args:
    index: int32 `[n]`, those ids' unique rows (the lookup's index of
      each, for those features only: work in proportion to them).
    num_rows: `U`, the step's unique rows.
    bound: see `Reached.bound`.
    valid: bool `[n]`, which of them hold a real id (None: all).
  """
  hits = tf.ones_like(index) if valid is None else tf.cast(valid, index.dtype)
  return Reached(tf.math.unsorted_segment_max(hits, index, num_rows) > 0, bound)


def compact(
  step: TableStep, row_grads: tf.Tensor, rows: Reached
) -> tuple[TableStep, tf.Tensor]:
  """The step and row gradients cut to the reached rows, in the step's
  layout: exactly the reached rows (the dynamic engine's unique ids,
  `num_unique` None) with `capacity` their bound; or, for the static
  engine's fixed-size slots, `[bound]` slots laid out as `static_bags.dedup`
  lays them out (the first `num_unique` the reached rows in order, the rest
  repeating slot 0 and its gradient), so the exchange has the same shape in
  every step. The step keeps no rows or lookup record: its update
  exchanges afresh.
  """
  mask = rows.mask
  if step.num_unique is None:
    return (
      dataclasses.replace(
        step,
        ids=tf.boolean_mask(step.ids, mask),
        capacity=rows.bound,
        rows=None,
        exchanged=None,
      ),
      tf.boolean_mask(row_grads, mask),
    )
  if rows.bound is None:
    raise ValueError("fixed-size slots need a static bound on the rows.")
  bound = rows.bound
  mask = tf.logical_and(mask, tf.range(tf.shape(step.ids)[0]) < step.num_unique)
  taken = tf.cast(mask, tf.int32)
  count = tf.reduce_sum(taken)
  # Each reached row's slot; the others land in slot `bound`, cut off.
  slot = tf.where(mask, tf.cumsum(taken) - 1, bound)[:, tf.newaxis]
  ids = tf.scatter_nd(slot, step.ids, [bound + 1])[:bound]
  grads = tf.scatter_nd(slot, row_grads, [bound + 1, row_grads.shape[-1]])
  # An update computes the same new row for each copy of slot 0.
  return (
    dataclasses.replace(
      step,
      ids=static_bags.pad_rows(ids[:, tf.newaxis], count)[:, 0],
      num_unique=count,
      capacity=bound,
      rows=None,
      exchanged=None,
    ),
    static_bags.pad_rows(grads[:bound], count),
  )
