"""The interface of a table's storage, and how storages register variables.

A storage owns one table's variables (the rows and the optimizer's slots)
and answers the three questions a step asks of them, whatever engine runs
it: the rows of this replica's unique ids (`gather`), the updates that apply
this replica's row gradients (`updates`), and whether the table can be read
and updated in place by this replica alone (`local_variables`: the fused
CPU kernels' fast path).

Example:
  >>> storage = replicated.Replicated(table, "items", Adagrad(0.1), strategy)
  >>> storage.create(tracker)                 # under strategy.scope()
  >>> rows, exchanged = storage.gather(unique_ids, valid=None, capacity=None)
"""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import tensorflow as tf

from backends import optimizers
from backends.storage import reset
from backends.table_step import TableStep


class Tracker:
  """Registers a storage's variables as checkpoint children of a backend.

  The backend is the checkpoint node: its children are `<table>` and
  `<table>/<slot>` (TF's mid-level layout). A pending checkpoint restore
  fills each child as it is created.

  Args:
    add_variable: `(name, initializer, shape, getter, trainable)` -> the
      variable, created through `getter` and tracked under `name` (the
      backend's `_add_variable_with_custom_getter`, which restores on create).
    add_trackable: `(name, trackable)` tracks any other saveable object.
  """

  def __init__(
    self,
    add_variable: Callable[..., tf.Variable],
    add_trackable: Callable[[str, Any], Any],
  ):
    self.add_variable = add_variable
    self.add_trackable = add_trackable


class TableStorage(abc.ABC):
  """One table's rows and slots, and how a step reads and updates them.

  Args:
    table: its `TableConfig`.
    name: its name (the checkpoint key).
    optimizer: its embedding optimizer (None: lookup only).
    strategy: the strategy the backend builds and runs under.
  """

  #: The placement this storage implements (`backends.storage.PLACEMENTS`,
  #: or "parameter_servers").
  placement: ClassVar[str] = ""

  def __init__(
    self,
    table: Any,
    name: str,
    optimizer: Any,
    strategy: tf.distribute.Strategy,
  ):
    self.table = table
    self.name = name
    self.optimizer = optimizer
    self.strategy = strategy

  @abc.abstractmethod
  def create(self, tracker: Tracker) -> None:
    """Creates the variables (under `strategy.scope()`) and tracks them."""

  @property
  @abc.abstractmethod
  def parameters(self) -> Any:
    """The table as users read it: `[vocabulary_size, dim]`."""

  @abc.abstractmethod
  def slots(self) -> dict[str, Any]:
    """The optimizer's slots by TF's slot name, each read as `[V, D]`."""

  def local_variables(self) -> dict[str, tf.Variable] | None:
    """`{"parameters": table, slot: variable}` this replica reads in place.

    None when the rows live elsewhere (shards): lookups then `gather`.
    """
    return None

  def use_fused_ops(self, fused_ops: Any) -> None:
    """Hands the storage the backend's loaded fused CPU kernels (its
    steps outside XLA may run them); none by default."""
    del fused_ops

  def kernel_variables(self) -> dict[str, tf.Variable] | None:
    """`local_variables` as the fused CPU kernels take them: also a narrow
    table's (bfloat16 / float16 rows, which they read and round themselves
    with `rounding`). None: the kernels do not touch this table."""
    return self.local_variables()

  @property
  def rounding(self) -> Any:
    """A narrow table's stochastic rounding
    (`backends.storage.narrow.Rounding`),
    None for a float32 table."""
    return None

  def saturated(self) -> Any:
    """A narrow table's values its updates saturated so far, the largest
    magnitude among them and its dtype
    (`backends.storage.narrow.SaturatedValues`);
    None for a float32 table."""
    return None

  def updates_alone(self) -> bool:
    """Whether this replica's update needs nobody else's gradients now."""
    return False

  def update_exchanges(self) -> bool:
    """Whether an update now exchanges gradients with other replicas."""
    return False

  def initial_rows(self, rows: tf.Tensor) -> dict[str, tf.Tensor]:
    """`{"parameters" | slot: [k, D] float32}`: the starting values of
    `rows` (int64 `[k]`) in the table and in every optimizer slot
    (`backends.storage.reset.starting_values`): what a dynamic-vocabulary
    table writes into a row it gives to a new id (`reset_rows`)."""
    return reset.starting_values(self.table, self.optimizer, rows)

  def check_resettable(self) -> None:
    """Raises `BackendSettingsError` naming the table if `initial_rows`
    cannot give rows known only in a step their starting values
    (`backends.storage.reset.check_resettable`)."""
    reset.check_resettable(self.table, self.name)

  def reset_rows(self, rows: tf.Tensor) -> Any:
    """Writes `rows`' starting values (`initial_rows`) into the table and
    every slot, on every replica that holds them; call in cross-replica
    context. A dynamic-vocabulary table does this to a row it gives to a
    new id, so the id inherits nothing of the row's previous owner."""
    raise NotImplementedError(
      f"table {self.name!r}: its storage ({type(self).__name__}) cannot "
      "reset rows, which a dynamic-vocabulary table needs."
    )

  @abc.abstractmethod
  def gather(
    self,
    ids: tf.Tensor,
    valid: tf.Tensor | None,
    capacity: int | tf.Tensor,
  ) -> tuple[tf.Tensor, Any]:
    """The rows of this replica's unique ids, and what the update reuses.

    Args:
      ids: int64 `[U]`, distinct where `valid`.
      valid: bool `[U]`, the slots that hold a real id (static shapes: the
        others repeat a real one or row 0); None: every slot.
      capacity: a bound on `U`: an int known when tracing (the same on every
        replica), else a scalar of the step (e.g. the number of ids before
        de-duplication), the same in every step of a loop when the inputs'
        shapes are (padded bags, whole batches).

    Returns:
      `(rows [U, D], exchanged)`: `exchanged` is kept in the step and given
      back to `updates`.
    """

  @abc.abstractmethod
  def updates(
    self, step: TableStep, row_grads: tf.Tensor
  ) -> list[optimizers.SparseUpdate]:
    """The sparse updates that apply this replica's row gradients.

    Args:
      step: the table's training lookup: its unique `ids` (static engine:
        the first `num_unique` slots distinct, the rest repeating slot 0),
        the `rows` read (reusable if nothing else wrote them) and what
        `gather` returned with them (`exchanged`).
      row_grads: `[U, D]`, this replica's gradient of each unique row.

    Returns:
      Updates to apply (grouped by optimizer by the caller); a storage that
      applies them itself (on remote shards) returns none.
    """
