"""The one step type joining the engines and the storages of owned tables.

A training lookup leaves one `TableStep` per table for `apply_gradients`,
whichever engine computed it (`backends.tensorcore.engines`: fused CPU kernels,
TF ops, or the static XLA path) and wherever the table's rows live
(`backends.storage`): the unique ids this replica looked up, the rows read,
what the engine needs for the rows' gradients (`backward`) and what the
storage exchanged with other replicas (`exchanged`, reused by the update).
`Features` is what the engines know of a backend's features and tables.

Example:
  >>> step = steps["items"]
  >>> grads = engine.row_gradients(table, step, flat_grads)   # [U, D]
  >>> updates = storage.updates(step, grads)
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from backends.input_checks import FeatureLayout


@dataclasses.dataclass
class TableStep:
  """What a training lookup leaves for `apply_gradients`, per table.

  Attributes:
    positions: the table's features' indices in the flat feature list.
    ids: int64 `[U]`, this replica's unique ids (static engine: `[N]`
      slots, the first `num_unique` distinct, the rest repeating slot 0).
    num_unique: the static engine's count of real slots; None: all real.
    capacity: a static bound on `U`, the same on every replica, or None.
    rows: `[U, D]`, the rows at lookup (None: read in place by a kernel).
    backward: the engine's record for the rows' gradients.
    exchanged: the storage's record of the lookup's exchange, or None.
  """

  positions: list[int]
  ids: tf.Tensor
  num_unique: tf.Tensor | None
  capacity: int | None
  rows: tf.Tensor | None
  backward: Any
  exchanged: Any = None


@dataclasses.dataclass(frozen=True)
class Features:
  """A backend's features and tables, as the engines see them.

  Attributes:
    layouts: every feature, in config order.
    bag_widths: feature path -> static bag width (None: dynamic).
    invalid_ids: the id policy (`backends.input_checks.ID_POLICIES`).
    tables: `(TableConfig, name)` of each table, in order of first use.
    dropped_tables: tables whose negative ids are left out of their bags
      whatever `invalid_ids` says: dynamic-vocabulary tables whose unknown
      ids read zeros (their index maps such an id to -1, and every other
      id to a row, so nothing else can be negative).
  """

  layouts: Sequence[FeatureLayout]
  bag_widths: Mapping[str, int | None]
  invalid_ids: str
  tables: Sequence[tuple[Any, str]]
  dropped_tables: frozenset[str] = frozenset()

  def id_policy(self, layout: FeatureLayout) -> str:
    """The id policy of `layout`'s feature: "drop" on a table in
    `dropped_tables`, else `invalid_ids`."""
    if layout.table_name in self.dropped_tables:
      return "drop"
    return self.invalid_ids

  def positions_of(self, table_name: str) -> list[int]:
    """The indices of the table's features in the flat feature list."""
    return [
      i
      for i, layout in enumerate(self.layouts)
      if layout.table_name == table_name
    ]

  def width(self, layout: FeatureLayout) -> int | None:
    """The most ids a bag of the feature keeps (sequence length or width)."""
    return layout.sequence_length or self.bag_widths[layout.path]

  def shape_output(
    self, index: int, sequence_length: int, acts: tf.Tensor
  ) -> tf.Tensor:
    """Feature `index`'s activations `[S, D]` in its output shape."""
    layout = self.layouts[index]
    dim = layout.feature.table.dim
    out_shape = layout.output_shape(None)
    if out_shape is not None:
      return tf.reshape(acts, out_shape + [dim])
    if sequence_length:
      return tf.reshape(acts, [-1, sequence_length, dim])
    return acts
