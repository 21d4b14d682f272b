"""The tpu_embedding backend: TF's accelerated TPU embedding APIs.

On a TPU whose `tpu_hardware_feature.embedding_feature` is `V1` (the
embedding engine of TPU v2-v4) this wraps
`tf.tpu.experimental.embedding.TPUEmbedding`; on `V2` (SparseCore, v5p and
later) it wraps `TPUEmbeddingV2`. The trainer's step does not change:

  * `lookup(training=True)` is V1's `enqueue` + `dequeue`, or V2's
    SparseCore preprocessing + lookup (whose partitioned inputs are kept for
    `apply_gradients`);
  * `apply_gradients(activation_gradients)` is the TF object's own, so the
    update runs on the embedding hardware with its optimizer semantics;
  * `input_options()` is `InputOptions(experimental_fetch_to_device=False)`:
    the ids must stay on the host for enqueueing;
  * `preprocess` turns dense `[B, N]` bags (and dense ids with weights) into
    `SparseTensor`s, which both engines accept; run it in `tf.data` — the
    features passed to `lookup` must be the direct arguments of
    `strategy.run` (TF's enqueue rule).

Configurations pass through unchanged (copied, never dropped: layout, dtype,
quantization and every optimizer field reach TF), including `AdagradMomentum`.
What the hardware cannot do or would silently ignore is refused at
construction with `UnsupportedConfigError` naming the table and option, e.g.
SparseCore ignores `clipvalue`, `clip_weight_min/max`, `lazy_adam=False`.

Dynamic-vocabulary tables (`layouts=` with a `vocabulary`) that never
reuse a row: `DynamicVocabulary(eviction="none", unknown="unknown_row")`
(collision-free until full, admission as set; then new ids read the
unknown row) and `HashedIds`. Their raw ids are mapped on the host before
the replica step (`map_ids`, the Trainer's loop), so the engine sees
static row ids. Evicting would give a row to a new id, which must start
again from its initial values in the table and every slot: the engine
keeps them in its own memory, where TF's API writes no single row, so
eviction is refused (`vocabulary_problem`), as are "zeros" tables (their
unknown ids would have to leave their bags on the host, a dense id's too).

Checkpoints: the backend's children are the TF object's, so it writes TF's
layout. With V1 that is `<table>` / `<table>.S<slot>`; with V2 TF stores
SparseCore's stacked, padded tables plus their layouts, which
`TPUEmbeddingForServing` (the `serving` backend) unstacks on restore: to move
a V2 checkpoint to another backend, restore it into `serving` with the
optimizer (for slots) and save again.

Nothing here has run on a TPU: none is reachable from the machines this was
written on. The dispatch, refusals and the arguments given to TF are tested
on CPU; `python -m recsys.tools.tpu_smoke` checks the rest on real hardware.
"""

import copy
import math
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from tensorflow.tpu.experimental import embedding

from backends import _tf_internal, base, hardware, layout, table_plan
from backends import pending as pending_lib
from backends.errors import BackendError
from backends.mid_level import common as mid_level
from backends.vocabulary.hashed import HashedIds

EmbeddingFeature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature

#: SparseCores per chip when the hardware does not say (TF's own default).
DEFAULT_SPARSECORES_PER_CHIP = 4


class TablesOnDeviceError(BackendError, RuntimeError):
  """The tables live in TPU embedding memory and cannot be read directly."""


def _hardware_version(strategy: tf.distribute.Strategy) -> str | None:
  feature = hardware.embedding_feature(strategy)
  if feature == EmbeddingFeature.V1:
    return "V1"
  if feature == EmbeddingFeature.V2:
    return "V2"
  return None


def _describe_strategy(strategy: tf.distribute.Strategy) -> str:
  try:
    devices = list(strategy.extended.worker_devices)
  except (AttributeError, RuntimeError):
    devices = []
  where = ", ".join(devices) if devices else "the default device"
  return f"{type(strategy).__name__} on {where}"


class TPUEmbeddingBackend(mid_level.MidLevelBackend):
  """TF's `TPUEmbedding` (embedding_feature V1) or `TPUEmbeddingV2` (V2).

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: a `TPUStrategy` on hardware with an embedding accelerator.
    per_replica_batch_size: the per-replica batch. V1 uses it to configure
      the engine at `build()` (otherwise TF configures it at the first
      `lookup` and the tables exist only from then on); V2 needs it (or an
      `output_shape` on every feature) for its static buffers, and it must be
      a multiple of the SparseCores per chip.
    pipeline_execution_with_tensor_core: TF's option: overlap the embedding
      step with the TensorCore step; activations are then one step stale, so
      results differ from every other backend's.
    sparse_core_embedding_config: V2 only: TF's `SparseCoreEmbeddingConfig`
      (table stacking, buffer sizes).

  Raises:
    BackendUnavailableError: not a TPU with embedding_feature V1 or V2.
    UnsupportedConfigError: the hardware cannot do, or would ignore, part of
      the configuration; the message names every table and option.

  Example:
    >>> with strategy.scope():                       # a TPUStrategy
    ...   emb = backends.create(feature_config, Adagrad(0.05), strategy,
    ...                         backend="tpu_embedding",
    ...                         per_replica_batch_size=128)
    ...   emb.build()
  """

  name = "tpu_embedding"
  capabilities = base.Capabilities(
    needs_tpu=True,
    sharded_tables=True,
    tpu_table_fields=True,
    dynamic_vocabularies=True,
  )
  options = base.EmbeddingBackend.options | {
    "per_replica_batch_size",
    "pipeline_execution_with_tensor_core",
    "sparse_core_embedding_config",
  }

  @classmethod
  def plan_tables(
    cls, request: table_plan.PlanRequest
  ) -> table_plan.BackendPlan:
    """The embedding engine splits every table over the TPU cores (the
    replicas); on one core every table is whole."""
    cores = request.num_shards
    if cores is None:
      cores = request.replicas
    cores = int(cores)
    if cores > 1:
      tables = table_plan.every_table_split(
        request,
        cores,
        f"{cls.name!r} shards every table over the {cores} TPU cores",
        layout.Placement.TPU_CORES,
      )
    else:
      tables = table_plan.whole_tables(request, cls.name)
    return table_plan.BackendPlan(
      tables, advice="shard the tables over more TPU cores (a larger slice)"
    )

  def layouts(self) -> dict[str, layout.TableLayout]:
    """As `plan_tables` says: every table split over the TPU cores (whole
    on one core), in its `TableConfig.dtype`."""
    cores = max(1, int(self._strategy.num_replicas_in_sync))
    where = layout.Placement.TPU_CORES if cores > 1 else None
    return {
      self.table_name(t): layout.TableLayout(
        where or layout.Placement.REPLICATED,
        t.dtype.name,
        vocabulary=self._dynamic.get(self.table_name(t)),
      )
      for t in self._tables
    }

  @classmethod
  def vocabulary_problem(cls, table: str, vocabulary: Any) -> str | None:
    """Only vocabularies that never give a used row to a new id: the
    engine's memory has no write of one row to reset it."""
    if isinstance(vocabulary, HashedIds):  # rows are hashes: never reset
      return None
    wrong = [
      f"{field} = {value!r} (needs {want!r})"
      for field, value, want in (
        ("eviction", str(vocabulary.eviction), "none"),
        ("unknown", str(vocabulary.unknown), "unknown_row"),
      )
      if value != want
    ]
    if not wrong:
      return None
    return (
      f"table {table!r}: DynamicVocabulary {' and '.join(wrong)} cannot "
      f"run on the {cls.name!r} backend: TF's TPUEmbedding keeps rows and "
      "slots in the embedding engine's memory, where its API writes no "
      "single row, so a row cannot start again for a new id (eviction "
      "'none': a row, once given, stays its id's) and an unknown id cannot "
      "be left out of its bag on the host (unknown 'unknown_row'). Set "
      "those, or train with 'tensorcore' or 'tpu_embedding_v0', which take "
      "every setting."
    )

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    per_replica_batch_size: int | None = None,
    pipeline_execution_with_tensor_core: bool = False,
    sparse_core_embedding_config: Any | None = None,
    layouts: layout.TableLayout
    | Mapping[str, layout.TableLayout]
    | None = None,
    **kwargs: Any,
  ):
    super().__init__(feature_config, optimizer, strategy, **kwargs)
    self._take_layouts(layouts)
    self._version = _hardware_version(self._strategy)
    self._per_replica_batch_size = per_replica_batch_size
    self._pipelining = pipeline_execution_with_tensor_core
    self._sc_config = sparse_core_embedding_config
    if sparse_core_embedding_config is not None and self._version != "V2":
      raise base.UnsupportedConfigError(
        "sparse_core_embedding_config applies to SparseCore "
        "(embedding_feature=V2) only; this TPU has embedding_feature="
        f"{self._version}. Remove it."
      )
    problems = (
      self._sparsecore_problems()
      if self._version == "V2"
      else self._v1_problems()
    )
    if problems:
      raise base.UnsupportedConfigError(
        f"the 'tpu_embedding' backend ({self.engine}) cannot run this "
        "configuration faithfully:\n  - "
        + "\n  - ".join(problems)
        + "\nChange these settings, or train with backend='tensorcore', "
        "which implements all of them."
      )
    # The training lookup awaiting apply_gradients: its activations (for the
    # gradients' shapes) and V2's preserved outputs.
    self._pending = _tf_internal.NoDependency(
      pending_lib.PendingLookups(self.name)
    )

  @classmethod
  def unavailable_reason(cls, strategy: tf.distribute.Strategy) -> str | None:
    if _hardware_version(strategy) is not None:
      return None
    feature = hardware.embedding_feature(strategy)
    if feature is not None:
      return (
        f"it needs a TPU with an embedding accelerator (embedding_feature "
        f"V1 or V2); this TPU has embedding_feature={feature.name}. Use "
        "'tensorcore' (replicated tables on the TensorCores) or "
        "'tpu_embedding_v0'"
      )
    return (
      "it needs a TPUStrategy on hardware with embedding_feature V1 or "
      f"V2; this is {_describe_strategy(strategy)}"
    )

  @property
  def engine(self) -> str:
    """`"TPUEmbedding (V1)"` or `"TPUEmbeddingV2 (SparseCore)"`."""
    return (
      "TPUEmbeddingV2 (SparseCore)"
      if self._version == "V2"
      else "TPUEmbedding (V1)"
    )

  # -- what the hardware cannot do ---------------------------------------------

  def _v1_problems(self) -> list[str]:
    problems = []
    for table in self._tables:
      name = self.table_name(table)
      if table.layout is not None:
        problems.append(
          f"table {name!r}: layout is a SparseCore (V2) setting; the V1 "
          "embedding engine ignores it. Set TableConfig.layout=None."
        )
      if table.dtype != tf.float32:
        problems.append(
          f"table {name!r}: dtype={table.dtype.name}; the V1 embedding engine "
          "only has float32 tables and would ignore it. Use float32."
        )
    return problems

  def _sparsecore_problems(self) -> list[str]:
    problems = []
    for table in self._tables:
      name = self.table_name(table)
      opt = self.optimizer_for(table)
      kind = type(opt).__name__
      ignored = []
      if opt.clip_gradient_min is not None or opt.clip_gradient_max is not None:
        ignored.append(
          f"clipvalue=({opt.clip_gradient_min}, {opt.clip_gradient_max})"
        )
      if opt.clip_weight_min is not None:
        ignored.append(f"clip_weight_min={opt.clip_weight_min}")
      if opt.clip_weight_max is not None:
        ignored.append(f"clip_weight_max={opt.clip_weight_max}")
      if (
        opt.weight_decay_factor is not None
        or opt.multiply_weight_decay_factor_by_learning_rate is not None
      ):
        ignored.append(f"weight_decay_factor={opt.weight_decay_factor}")
      if not opt.use_gradient_accumulation:
        ignored.append("use_gradient_accumulation=False")
      if opt.low_dimensional_packing_status:
        ignored.append("low_dimensional_packing_status=True")
      if isinstance(opt, embedding.Adam) and not opt.lazy_adam:
        ignored.append("lazy_adam=False (SparseCore always updates lazily)")
      if isinstance(opt, embedding.FTRL) and opt.allow_zero_accumulator:
        ignored.append("allow_zero_accumulator=True")
      if ignored:
        problems.append(
          f"table {name!r}: SparseCore ignores {kind} "
          f"{', '.join(ignored)}; leave them at their defaults."
        )
    cores = self.sparsecores_per_chip
    for path, feature in self._flat_features:
      table = self.table_name(feature.table)
      if feature.max_sequence_length:
        problems.append(
          f"feature {path!r} (table {table!r}): max_sequence_length="
          f"{feature.max_sequence_length}; TPUEmbeddingV2 has no sequence "
          "features and would ignore it."
        )
      shape = feature.output_shape
      has_shape = bool(shape) and shape.rank and shape.is_fully_defined()
      if has_shape:
        samples = math.prod(shape.as_list())
      elif self._per_replica_batch_size is None:
        problems.append(
          f"feature {path!r} (table {table!r}): SparseCore needs static "
          "per-replica output shapes; pass per_replica_batch_size= (or set "
          "FeatureConfig.output_shape)."
        )
        continue
      else:
        samples = self._per_replica_batch_size
      if samples % cores:
        problems.append(
          f"feature {path!r} (table {table!r}): {samples} samples per "
          f"replica is not a multiple of the {cores} SparseCores per chip; "
          f"use a per-replica batch that is."
        )
    return problems

  @property
  def sparsecores_per_chip(self) -> int:
    hardware = getattr(self._strategy.extended, "tpu_hardware_feature", None)
    count = getattr(hardware, "num_embedding_devices_per_chip", 0) or 0
    return int(count) or DEFAULT_SPARSECORES_PER_CHIP

  # -- what is passed to TF ----------------------------------------------------

  def _tf_class(self) -> type:
    return (
      embedding.TPUEmbeddingV2
      if self._version == "V2"
      else embedding.TPUEmbedding
    )

  def _tf_constructor_kwargs(self) -> dict[str, Any]:
    """The keyword arguments for `_tf_class()`: copied configs, TF's options.

    Every table of the copied `feature_config` carries its resolved optimizer,
    so `optimizer` is None. V2 features get `output_shape=[per-replica batch]`
    when they have none (SparseCore needs static shapes).
    """
    feature_fn = None
    if self._version == "V2":

      def feature_fn(path, feature):
        del path
        if feature.output_shape and feature.output_shape.rank:
          return {}
        return {"output_shape": tf.TensorShape([self._per_replica_batch_size])}

    config, tables = mid_level.tf_feature_config(self, feature_fn)
    if self._version == "V1":
      for table in tables.values():
        table.optimizer = _with_proto_packing_status(table.optimizer)
    kwargs = {
      "feature_config": config,
      "optimizer": None,
      "pipeline_execution_with_tensor_core": self._pipelining,
    }
    if self._version == "V2":
      kwargs["sparse_core_embedding_config"] = self._sc_config
    return kwargs

  def _per_replica_input_shapes(self) -> list[tf.TensorShape] | None:
    """Input shapes for V1's `build()` from the per-replica batch, or None.

    TF derives each feature's output shape from its input shape: `[B]` ->
    `[B]`, and a sequence feature's `[B, L, 1]` -> `[B, L]`.
    """
    if self._per_replica_batch_size is None:
      return None
    shapes = []
    for _, feature in self._flat_features:
      batch = self._per_replica_batch_size
      if feature.output_shape and feature.output_shape.rank:
        shapes.append(tf.TensorShape(feature.output_shape.as_list() + [1]))
      elif feature.max_sequence_length:
        shapes.append(tf.TensorShape([batch, feature.max_sequence_length, 1]))
      else:
        shapes.append(tf.TensorShape([batch]))
    return shapes

  def _create_mid_level(self) -> Any:
    return self._tf_class()(**self._tf_constructor_kwargs())

  def _build_mid_level(self, mid: Any) -> None:
    self._make_stage(_rows_never_reused)
    if self._version == "V2":
      mid.build()
      return
    shapes = self._per_replica_input_shapes()
    if shapes is not None:
      mid.build(per_replica_input_shapes=shapes)
    # else: TF configures the engine and creates the tables at the first
    # enqueue, from the shapes it sees (restores queued before are kept).

  # -- the step ----------------------------------------------------------------

  def preprocess(self, features: Any, weights: Any | None = None):
    """Dense `[B, N]` bags, weighted dense ids -> `SparseTensor` (on host)."""
    flat = self._flatten_like_config(features, "features")
    flat_w = (
      self._flatten_like_config(weights, "weights")
      if weights is not None
      else [None] * len(flat)
    )
    out, out_w = [], []
    for inp, w in zip(flat, flat_w):
      if isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
        out.append(inp)
        out_w.append(w)
        continue
      inp = tf.convert_to_tensor(inp)
      if (inp.shape.rank == 2 and inp.shape[1] != 1) or w is not None:
        inp, w = _dense_to_sparse(inp, w)
      out.append(inp)
      out_w.append(w)
    return self._pack_inputs(out, out_w)

  def lookup(
    self, features: Any, weights: Any | None = None, training: bool = False
  ) -> Any:
    """Enqueues the ids and returns the activations (inside `strategy.run`).

    Args:
      features: the structure of `feature_config`, taken directly from the
        arguments of `strategy.run` (after `preprocess` in the input pipeline).
      weights: None or the same structure of float weights.
      training: V1: enqueue for training (then call `apply_gradients` in the
        same step) or inference.

    Returns:
      The activations, structured like `feature_config`.
    """
    if not self._built:
      self.build()
    self._flatten_like_config(features, "features")
    preserved = None
    if self._version == "V2":
      activations, preserved = self._mid(features, weights)
    else:
      self._mid.enqueue(features, weights, training=training)
      activations = self._mid.dequeue()
    if training:
      self._pending.record((tf.nest.flatten(activations), preserved))
    return activations

  def apply_gradients(self, activation_gradients: Any) -> None:
    """Sends d(loss)/d(activations) to the embedding hardware's optimizer.

    Raises:
      GradientShapeError: a gradient's shape is not its activation's.
    """
    pending = self._pending.take()
    if pending is None:
      raise RuntimeError(
        "apply_gradients() needs a lookup(..., training=True) "
        "earlier in the same step."
      )
    flat_activations, preserved = pending
    flat_grads = self._flatten_like_config(
      activation_gradients, "activation gradients"
    )
    base.check_activation_gradients(
      [path for path, _ in self._flat_features],
      flat_grads,
      flat_activations,
      self.feature_table_names(),
    )
    if self._version == "V2":
      self._mid.apply_gradients(
        activation_gradients, preserved_outputs=preserved
      )
      return
    self._mid.apply_gradients(activation_gradients)

  def input_options(self) -> tf.distribute.InputOptions:
    """Ids stay on the host: the embedding engine enqueues them from there."""
    return tf.distribute.InputOptions(experimental_fetch_to_device=False)

  # -- variables ---------------------------------------------------------------

  def _variables_by_table(self) -> dict[str, dict[str, tf.Variable]]:
    raise TablesOnDeviceError(
      f"the tables of the 'tpu_embedding' backend ({self.engine}) live sharded "
      "in TPU memory and cannot be read as variables here. Save a checkpoint "
      "(tf.train.Checkpoint(embedding=backend)) and restore it into "
      "backends.mid_level.serving.ServingEmbedding, or read it with "
      "tf.train.load_checkpoint."
    )

  def retrieve_from_tpu(self) -> None:
    """Refreshes the V1 engine's CPU copies of the tables (before a save)."""
    if self._mid is not None and self._version == "V1":
      _tf_internal.retrieve_from_tpu(self._mid)

  def load_onto_tpu(self) -> None:
    """Pushes the V1 CPU copies of the tables to the engine (after restore)."""
    if self._mid is not None and self._version == "V1":
      _tf_internal.load_onto_tpu(self._mid)


def _rows_never_reused(table: str, rows: tf.Tensor) -> Any:
  """A dynamic table's reset on this backend: none. Its vocabularies never
  evict (`vocabulary_problem`), so a row given to a new id was never any
  id's: no lookup reached it, it holds its initial values still."""
  del table, rows
  return tf.no_op()


def _with_proto_packing_status(optimizer: Any) -> Any:
  """A copy of `optimizer` whose `low_dimensional_packing_status` is an int.

  TF 2.21 writes the boolean into the enum field
  `OptimizationParameters.low_dimensional_packing_status` when it builds the
  V1 engine configuration; protobuf's upb runtime rejects bools for enum
  fields (TypeError), so `TPUEmbedding` could not configure the engine at
  all. The int keeps TF's meaning (False -> 0 UNSPECIFIED, True -> 1
  ENABLED) and compares and hashes equal to the bool.
  """
  fixed = copy.copy(optimizer)
  fixed.low_dimensional_packing_status = int(
    bool(optimizer.low_dimensional_packing_status)
  )
  return fixed


def _dense_to_sparse(ids: tf.Tensor, weights: tf.Tensor | None):
  """Every entry of dense `[B]`/`[B, N]` ids (id 0 too) as a SparseTensor."""
  if ids.shape.rank == 1:
    ids = ids[:, tf.newaxis]
    weights = (
      None if weights is None else tf.convert_to_tensor(weights)[:, tf.newaxis]
    )
  shape = tf.shape(ids, out_type=tf.int64)
  rows = tf.repeat(tf.range(shape[0]), shape[1])
  cols = tf.tile(tf.range(shape[1]), [shape[0]])
  indices = tf.stack([rows, cols], axis=1)
  sparse_ids = tf.SparseTensor(indices, tf.reshape(ids, [-1]), shape)
  if weights is None:
    return sparse_ids, None
  return sparse_ids, tf.SparseTensor(
    indices, tf.reshape(tf.cast(weights, tf.float32), [-1]), shape
  )


# With V1 on a TPU the tables live in the embedding engine; the CPU variables
# TF checkpoints are refreshed before a save and pushed back after a restore.
# TF registers this for its TPUEmbedding objects; here the checkpointed node is
# the backend, so the backend registers the same callbacks.
def _on_tpu_engine(obj: Any) -> bool:
  mid = getattr(obj, "_mid", None)
  return (
    isinstance(obj, TPUEmbeddingBackend)
    and mid is not None
    and _tf_internal.mid_level_on_tpu(mid)
  )


def _save_callback(trackables, **unused_kwargs):
  for backend in trackables.values():
    backend.retrieve_from_tpu()
  return []


def _restore_callback(trackables, **unused_kwargs):
  for backend in trackables.values():
    backend.load_onto_tpu()


_tf_internal.register_checkpoint_saver(
  package="recsys",
  name="TPUEmbeddingBackendCallback",
  predicate=_on_tpu_engine,
  save_fn=_save_callback,
  restore_fn=_restore_callback,
  strict_predicate_restore=False,
)
