"""The interface of a lookup engine (see `backends.tensorcore.engines`)."""

import abc
import dataclasses
from typing import Any

import tensorflow as tf

from backends import _bags, gradient_rows
from backends import input_checks as checks_lib
from backends.storage.base import TableStorage
from backends.table_step import Features, TableStep


class Engine(abc.ABC):
  """Looks up a backend's features and computes its tables' row gradients.

  Args:
    features: the backend's features and tables.
  """

  #: "fused", "tf_ops" or "static".
  name: str = ""

  def __init__(self, features: Features):
    self.features = features

  @abc.abstractmethod
  def lookup(
    self,
    flat: list[Any],
    flat_weights: list[Any],
    counters: Any,
    storages: dict[str, TableStorage],
    training: bool,
  ) -> tuple[list[tf.Tensor], dict[str, TableStep]]:
    """Every feature's activations, and per table its step if training.

    Args:
      flat, flat_weights: the features' inputs and weights, in config order.
      counters: `backends.input_counters.InputCounters` to count refused
        and cut ids in, or None.
      storages: each table's storage, by name.
      training: leave the steps `apply_gradients` needs.
    """

  @abc.abstractmethod
  def row_gradients(
    self, table: Any, step: TableStep, flat_grads: list[Any]
  ) -> tf.Tensor:
    """d(loss)/d(row) of each of the step's unique ids, `[U, D]`."""

  def reached_rows(
    self, step: TableStep, flat_grads: list[Any]
  ) -> gradient_rows.Reached | None:
    """The step's unique rows that a gradient reaches, when some feature of
    the table has none (None: every feature has one, or the step's fixed
    slots have no static bound to cut them to)."""
    carries = [flat_grads[p] is not None for p in step.positions]
    if all(carries):
      return None
    kept = [f for f, has in zip(self.ids_by_feature(step), carries) if has]
    if not kept:
      return gradient_rows.Reached(tf.zeros([0], tf.bool), 0)
    capacities = [capacity for _, _, capacity in kept]
    bound = None
    if all(capacity is not None for capacity in capacities):
      bound = sum(int(capacity or 0) for capacity in capacities)
    if bound is None and step.num_unique is not None:
      return None
    valids = [valid for _, valid, _ in kept]
    return gradient_rows.reached(
      tf.concat([index for index, _, _ in kept], 0),
      tf.size(step.ids, out_type=tf.int32),
      bound,
      None if any(v is None for v in valids) else tf.concat(valids, 0),
    )

  def ids_by_feature(
    self, step: TableStep
  ) -> list[tuple[tf.Tensor, tf.Tensor | None, int | None]]:
    """Per feature of the step's table, in order: its ids' unique rows
    (the lookup's index), which of them are real (None: all) and a static
    bound on their number (None: none)."""
    raise NotImplementedError(f"the {self.name!r} engine cannot cut updates")

  def apply_in_place(
    self,
    table: Any,
    step: TableStep,
    flat_grads: list[Any],
    storage: TableStorage,
    optimizer: Any,
  ) -> bool:
    """Applies the update in one fused pass if it can; False: it did not."""
    del table, step, flat_grads, storage, optimizer
    return False

  def check_update(
    self, name: str, step: TableStep, storage: TableStorage
  ) -> None:
    """Raises if the storage cannot apply this step's update as it is."""
    del name, step, storage

  def update_kernels(self) -> Any | None:
    """The fused kernels for `optimizers.apply_sparse_updates`, or None."""
    return None


def after_checks(checks: checks_lib.CheckGroup, bags: list[Any]) -> list[Any]:
  """The bags, their ids read only once the group's checks hold (graph
  mode): no gather of the lookup reads an id before it is checked."""
  deps = checks.assertion()
  if not deps:
    return bags
  with tf.control_dependencies(deps):
    return [dataclasses.replace(b, ids=tf.identity(b.ids)) for b in bags]


def activation_gradients(
  table: Any, positions: list[int], sizes: list[Any], flat_grads: list[Any]
) -> list[tf.Tensor]:
  """The table's features' activation gradients, each `[S_f, D]`."""
  return _bags.feature_gradients(flat_grads, positions, sizes, table.dim)
