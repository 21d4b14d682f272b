"""Shared plumbing of the backends that wrap a TF mid-level API object.

The `tpu_embedding`, `tpu_embedding_v0` and `serving` backends each hold one
of TF's classes (`TPUEmbedding`, `TPUEmbeddingV2`, `TPUEmbeddingV0`,
`TPUEmbeddingForServing`). This module owns what they share:

* `tf_feature_config`: the configuration handed to TF. TF's classes write
  into the `TableConfig`s they receive (a table without an optimizer gets the
  default one, an unnamed table gets a name, SparseCore rewrites layouts and
  padded sizes), so they get copies with every field kept — initializer,
  combiner, quantization, layout, dtype — and the resolved name and
  optimizer filled in. The user's objects are never modified.
* `MidLevelBackend`: checkpoint delegation. The backend's trackable children
  are the wrapped object's children, so `tf.train.Checkpoint(embedding=
  backend)` writes exactly the keys `tf.train.Checkpoint(embedding=tf_object)`
  writes (`<table>` and `<table>.S<slot>`), and a restore requested before
  `build()` is handed to the TF object, which restores on variable creation.
"""

import copy
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf
from tensorflow.tpu.experimental import embedding

from backends import _tf_internal, base, layout
from backends.vocabulary import stage as stage_lib


def tf_feature_config(
  backend: base.EmbeddingBackend,
  feature_fn: Callable[[str, Any], dict[str, Any]] | None = None,
) -> tuple[Any, dict[str, embedding.TableConfig]]:
  """Copies the backend's feature config for a TF mid-level class.

  Args:
    backend: the (constructed) backend whose configuration to copy.
    feature_fn: optional `(path, FeatureConfig) -> {attribute: value}` of
      FeatureConfig attributes to override in the copy (e.g. `output_shape`).

  Returns:
    `(feature_config, tables)`: the copied nested structure, whose features
    sharing a table share one copied `TableConfig`; and the copied tables by
    table name. Each copy has `name` set to the backend's table name and
    `optimizer` to the table's resolved optimizer (None for lookup-only use
    without one).
  """
  copies: dict[int, embedding.TableConfig] = {}
  by_name: dict[str, embedding.TableConfig] = {}
  for table in backend.tables:
    clone = copy.copy(table)
    clone.name = backend.table_name(table)
    clone.optimizer = backend.optimizer_for(table)
    copies[id(table)] = clone
    by_name[clone.name] = clone
  flat = []
  for path, feature in _tf_internal.flatten_with_joined_string_paths(
    backend.feature_config
  ):
    clone = copy.copy(feature)
    clone.table = copies[id(feature.table)]
    for key, value in (feature_fn(path, feature) if feature_fn else {}).items():
      setattr(clone, key, value)
    flat.append(clone)
  return tf.nest.pack_sequence_as(backend.feature_config, flat), by_name


class MidLevelBackend(base.EmbeddingBackend):
  """A backend whose variables live in a wrapped TF mid-level API object.

  Subclasses implement `_create_mid_level()` (called by `build()` under the
  strategy scope) and the lookup/training methods.
  """

  #: The TF object, once `build()` made it.
  _mid: Any = None
  #: Dynamic-vocabulary table name -> its vocabulary (`_take_layouts`).
  _dynamic: dict[str, Any] = {}
  #: The indices' checkpoint node (`VocabularyStage.trackable`), once made.
  _stage_node: Any = None

  def _create_mid_level(self) -> Any:
    """Returns the TF object (called once, under the strategy's scope)."""
    raise NotImplementedError

  @property
  def mid_level(self) -> Any:
    """The wrapped TF object (None before `build()`)."""
    return self._mid

  @base.cross_replica_build
  def build(self) -> None:
    """Creates the TF object and its tables and slots (idempotent)."""
    if self._built:
      return
    with tf.init_scope(), self._strategy.scope():
      mid = self._create_mid_level()
      self._mid = _tf_internal.NoDependency(mid)
      self._hand_over_deferred_restores(mid)
      self._build_mid_level(mid)
    self._built = True

  def _build_mid_level(self, mid: Any) -> None:
    mid.build()

  def _hand_over_deferred_restores(self, mid: Any) -> None:
    """Moves restores requested before build() to the TF object.

    `checkpoint.restore()` on an unbuilt backend queues the values under the
    backend; the TF object creates its variables through
    `_add_variable_with_custom_getter`, which restores from its own queue.
    """
    pending = _tf_internal.deferred_restores(self)
    if not pending:
      return
    queued = _tf_internal.deferred_restores(mid)
    kept = self._own_child_names()
    for name, positions in list(pending.items()):
      if name not in kept:
        queued.setdefault(name, []).extend(positions)
        del pending[name]

  # -- dynamic-vocabulary tables ---------------------------------------------

  def _take_layouts(
    self, layouts: layout.TableLayout | Mapping[str, layout.TableLayout] | None
  ) -> None:
    """Reads the planned layouts' vocabularies (the only part of a layout
    a TF mid-level object can honour), checked against their tables
    before any work: `self._dynamic`."""
    tables = {self.table_name(t): t for t in self._tables}
    self._dynamic = layout.vocabularies(tables, layouts)
    for name, vocabulary in self._dynamic.items():
      vocabulary.check(name, tables[name].vocabulary_size)
      problem = self.vocabulary_problem(name, vocabulary)
      if problem:
        raise base.UnsupportedConfigError(problem)

  def _make_stage(self, reset_rows: Callable[[str, tf.Tensor], Any]) -> None:
    """The dynamic tables' indices (`backends.vocabulary.stage`), a child of
    the backend's checkpoint beside the TF object's tables (restored now
    when a restore was requested before `build()`); `reset_rows(table,
    rows)` writes the starting values of the rows given to new ids."""
    if not self._dynamic:
      return
    tables = {self.table_name(t): t for t in self._tables}
    self._stage = _tf_internal.NoDependency(
      stage_lib.VocabularyStage(
        {n: (tables[n], v) for n, v in self._dynamic.items()},
        self.feature_table_names(),
        self._strategy,
        reset_rows,
      )
    )
    self._stage_node = _tf_internal.NoDependency(self._stage.trackable())
    _tf_internal.track_child(self, self._stage_node, stage_lib.CHECKPOINT_KEY)

  def _own_child_names(self) -> frozenset[str]:
    """The checkpoint children the backend tracks itself, beside the TF
    object's (the dynamic tables' indices): their restores requested
    before `build()` stay with the backend, which restores them on
    creation."""
    return frozenset({stage_lib.CHECKPOINT_KEY} if self._dynamic else ())

  def _own_children(self) -> dict[str, Any]:
    """Those children, once made (`_own_child_names`)."""
    if self._stage_node is None:
      return {}
    return {stage_lib.CHECKPOINT_KEY: self._stage_node}

  # -- checkpoint layout: the wrapped object's children, under our node -------

  def _trackable_children(
    self, save_type=_tf_internal.SaveType.CHECKPOINT, **kwargs
  ):
    if getattr(self, "_mid", None) is None:
      return {}
    children = _tf_internal.trackable_children(self._mid, save_type, **kwargs)
    return {**children, **self._own_children()}

  def _lookup_dependency(self, name, cached_dependencies=None):
    if cached_dependencies:
      return cached_dependencies.get(name)
    mid = getattr(self, "_mid", None)
    if mid is not None:
      found = _tf_internal.lookup_dependency(mid, name)
      if found is not None:
        return found
    return super()._lookup_dependency(name)

  # -- variables ---------------------------------------------------------------

  def _variables_by_table(self) -> dict[str, dict[str, tf.Variable]]:
    """TF's `{table name: {"parameters" | slot name: variable}}`."""
    self._maybe_build()
    return _tf_internal.mid_level_variables(self._mid)

  @property
  def embedding_tables(self) -> dict[embedding.TableConfig, tf.Variable]:
    """The table variables, keyed by the user's `TableConfig`."""
    variables = self._variables_by_table()
    return {
      t: variables[self.table_name(t)]["parameters"] for t in self._tables
    }

  def slot_variables(self) -> dict[str, dict[str, tf.Variable]]:
    variables = self._variables_by_table()
    return {
      self.table_name(t): {
        k: v
        for k, v in variables[self.table_name(t)].items()
        if k != "parameters"
      }
      for t in self._tables
    }
