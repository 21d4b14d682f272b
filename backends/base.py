"""The embedding backend interface every backend implements.

The lifecycle mirrors TF's TPU embedding mid-level API so that TPU backends are
thin wrappers and the TensorCore backend is a drop-in for `TPUEmbeddingV0`:

    emb = backends.create(feature_config, optimizer, strategy)   # or a class
    with strategy.scope():
      emb.build()
    # inside strategy.run(step):
    with tf.GradientTape() as tape:
      activations = emb.lookup(features, weights, training=True)
      tape.watch(activations)
      loss = model(activations, ...)
    emb.apply_gradients(tape.gradient(loss, activations))

Output-shape convention (the same on every backend): a feature without
`max_sequence_length` yields `[B, D]` whatever its input kind (dense ids of
shape `[B]` or `[B, N]`, sparse or ragged bags of shape `[B, None]`), the bag
combined with its table's combiner; a sequence feature yields `[B, L, D]` with
`L = max_sequence_length`, padded with zeros or truncated; a feature with
`output_shape` yields `output_shape + [D]`.
"""

import abc
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import (
  Any,
  ClassVar,
)

import numpy as np
import tensorflow as tf
from tensorflow.tpu.experimental.embedding import FeatureConfig, TableConfig

from backends import _tf_internal, layout, quantization, table_plan
from backends import inputs as inputs_lib
from backends.errors import BackendError, BackendSettingsError

embedding = tf.tpu.experimental.embedding

#: The optimizer classes of `tf.tpu.experimental.embedding`, by their names.
OPTIMIZER_CLASSES: tuple[type, ...] = (
  embedding.SGD,
  embedding.Adagrad,
  embedding.AdagradMomentum,
  embedding.Adam,
  embedding.FTRL,
)
ALL_COMBINERS = frozenset({"sum", "mean", "sqrtn"})
ALL_INPUT_KINDS = frozenset({"dense", "sparse", "ragged"})


class BackendUnavailableError(BackendSettingsError, RuntimeError):
  """The backend cannot run under the current strategy or hardware."""


class UnsupportedConfigError(BackendSettingsError, ValueError):
  """The configuration asks for something the backend cannot do faithfully."""


class UnsupportedInputError(BackendError, ValueError):
  """A feature's ids are of a kind the backend does not declare it takes."""


def input_kind(ids: Any) -> str | None:
  """The kind of a feature's ids: "dense", "sparse" or "ragged".

  None for anything else, e.g. `backends.inputs.PaddedBags`, a backend's
  own `preprocess` output.
  """
  if isinstance(ids, tf.SparseTensor):
    return "sparse"
  if isinstance(ids, tf.RaggedTensor):
    return "ragged"
  if tf.is_tensor(ids) or isinstance(ids, (np.ndarray, list, int)):
    return "dense"
  return None


def checked_restore_only(restore_only: Any) -> bool:
  """The backend option `restore_only` (True or False), checked.

  Raises:
    UnsupportedConfigError: any other value.
  """
  if not isinstance(restore_only, bool):
    raise UnsupportedConfigError(
      f"restore_only={restore_only!r}; use True (the tables alone, no "
      "optimizer slots: a backend to restore a checkpoint into and look "
      "up, not train) or False."
    )
  return restore_only


def cross_replica_build(build: Callable[..., None]) -> Callable[..., None]:
  """Makes a backend's `build()` work from inside a replica function.

  Keras builds a layer at its first call, which for a subclassed model (every
  TFRS tutorial's) is inside `fit`'s replica step: `strategy.run` under
  `MirroredStrategy`, `MultiWorkerMirroredStrategy` or `TPUStrategy`, where
  `strategy.scope()` is refused. Called there, the decorated `build` runs
  once for all replicas in cross-replica context (`merge_call`), as TF's own
  variable creation does; elsewhere it runs as it is.
  """

  @functools.wraps(build)
  def wrapper(self, *args, **kwargs):
    if (
      tf.distribute.has_strategy()
      and not tf.distribute.in_cross_replica_context()
    ):
      return tf.distribute.get_replica_context().merge_call(
        lambda _: build(self, *args, **kwargs)
      )
    return build(self, *args, **kwargs)

  return wrapper


class GradientShapeError(BackendError, ValueError):
  """An activation gradient's shape differs from its activation's shape."""

  # Raised while a tf.function traces: AutoGraph re-raises an error with its
  # own type only if the type's __init__ is Exception's (else StagingError).
  __init__ = Exception.__init__


class GradientDtypeError(BackendError, TypeError):
  """An activation gradient that is not a floating-point tensor."""

  __init__ = Exception.__init__  # see GradientShapeError


def check_activation_gradients(
  paths: Sequence[str],
  gradients: Sequence[Any],
  activations: Sequence[Any],
  tables: Sequence[str] | None = None,
) -> list[tf.Tensor | None]:
  """Refuses activation gradients whose shape is not their activation's.

  A gradient of the wrong shape would otherwise be reshaped or partly read
  (an extra row ignored, `[D, B]` taken for `[B, D]`) and silently applied.
  Shapes known when tracing (always, eagerly) are compared right away; any
  dimension known only at run time costs one comparison of `tf.shape`s in
  the step, which fails it with the same message.

  Args:
    paths: the features' paths, in feature order (named in the error).
    gradients: per feature, d(loss)/d(activations): a tensor,
      `tf.IndexedSlices` or None (the loss does not use the feature).
    activations: per feature, the activations `lookup` returned (or their
      `tf.TensorShape` when no tensor is at hand).
    tables: per feature, its table's name (named in the errors).

  Returns:
    The gradients as dense tensors (None stays None), carrying the run-time
    check where one was needed.

  Raises:
    GradientShapeError: naming the feature, the expected and the got shape.
    GradientDtypeError: a gradient that is not floating point (an int32
      tensor would be cast, or fail deep in the update), naming the feature,
      its table and the dtype.
  """
  out: list[tf.Tensor | None] = []
  names = list(tables) if tables is not None else [None] * len(paths)
  for path, table, grad, act in zip(paths, names, gradients, activations):
    if grad is None:
      out.append(None)
      continue
    if isinstance(grad, tf.IndexedSlices):
      grad = tf.convert_to_tensor(grad)
    elif not tf.is_tensor(grad):
      grad = tf.convert_to_tensor(grad)
    if not grad.dtype.is_floating:
      where = f" (table {table!r})" if table is not None else ""
      raise GradientDtypeError(
        f"activation gradient of feature {path!r}{where} has dtype "
        f"{grad.dtype.name}; expected floating point (float32), the "
        "gradient of the loss with respect to the feature's activations."
      )
    expected = (
      act if isinstance(act, tf.TensorShape) else tf.TensorShape(act.shape)
    )
    got = grad.shape
    message = (
      f"activation gradient of feature {path!r} has shape {{got}}; "
      f"expected {{expected}}, the shape of the feature's "
      "activations from lookup(..., training=True)."
    )
    if expected.rank is not None and got.rank is not None:
      if expected.rank != got.rank or not got.is_compatible_with(expected):
        raise GradientShapeError(
          message.format(got=got.as_list(), expected=expected.as_list())
        )
    if (
      (got.is_fully_defined() and expected.is_fully_defined())
      or isinstance(act, tf.TensorShape)
      or tf.executing_eagerly()
    ):
      out.append(grad)
      continue
    # Some dimension is known only when the step runs: one cheap check.
    got_dyn, exp_dyn = tf.shape(grad), tf.shape(act)
    same = tf.logical_and(
      tf.equal(tf.size(got_dyn), tf.size(exp_dyn)),
      tf.reduce_all(
        tf.equal(
          tf.pad(
            got_dyn, [[0, tf.maximum(tf.size(exp_dyn) - tf.size(got_dyn), 0)]]
          ),
          tf.pad(
            exp_dyn, [[0, tf.maximum(tf.size(got_dyn) - tf.size(exp_dyn), 0)]]
          ),
        )
      ),
    )
    check = tf.debugging.Assert(
      same,
      [
        f"activation gradient of feature `{path}` has shape",
        got_dyn,
        "; expected",
        exp_dyn,
        ", the shape of the feature's activations "
        "from lookup(..., training=True).",
      ],
    )
    with tf.control_dependencies([check]):
      out.append(tf.identity(grad))
  return out


def _batch_size(ids: Any) -> tuple[int | None, Any]:
  """A feature input's batch size: (static value or None, a scalar tensor
  or None when it cannot be read)."""
  if isinstance(ids, inputs_lib.PaddedBags):
    ids = ids.ids
  if isinstance(ids, tf.SparseTensor):
    static = tf.get_static_value(ids.dense_shape)
    if static is not None:
      return int(static[0]), None
    return ids.shape[0], ids.dense_shape[0]
  if isinstance(ids, tf.RaggedTensor):
    return ids.shape[0], ids.nrows()
  if tf.is_tensor(ids):
    if ids.shape.rank == 0:
      return None, None
    return ids.shape[0], (tf.shape(ids)[0] if ids.shape.rank else None)
  if isinstance(ids, (np.ndarray, list)):
    shape = np.shape(ids)
    return (shape[0] if shape else None), None
  return None, None


def check_batch_sizes(features: Sequence[str], flat_inputs: Sequence[Any]):
  """Refuses features whose inputs have different batch sizes.

  Each feature's activations have its input's batch size, so a `[3]` and a
  `[1]` input would give activations of different batch sizes, silently.
  Sizes known when tracing (always, eagerly) are compared right away; in a
  graph, inputs whose size is known only at run time get one check in the
  step (none in an XLA-compiled step, which cannot raise; its shapes are
  static anyway).

  Args:
    features: per feature, its name for the message.
    flat_inputs: per feature, its ids (dense, sparse, ragged or padded).

  Raises:
    inputs_lib.InvalidInputError: naming every feature and its batch size.
  """
  sizes = [_batch_size(ids) for ids in flat_inputs]
  known = {
    name: static
    for name, (static, _) in zip(features, sizes)
    if static is not None
  }
  message = (
    "the features of one call must have the same batch size; got {}. "
    "Pass one batch: every feature's ids with the same number of rows."
  )
  if len(set(known.values())) > 1:
    raise inputs_lib.InvalidInputError(
      message.format(", ".join(f"{n}: {b}" for n, b in known.items()))
    )
  dynamic = [
    (name, size)
    for name, (static, size) in zip(features, sizes)
    if static is None and size is not None
  ]
  if not dynamic or (len(dynamic) == 1 and not known):
    return
  if _tf_internal.in_xla_context():
    return
  values = [tf.cast(size, tf.int64) for _, size in dynamic]
  values += [tf.constant(b, tf.int64) for b in known.values()]
  stacked = tf.stack(values)
  names = [n for n, _ in dynamic] + list(known)
  head = message.split("{}")[0]
  tf.debugging.Assert(
    tf.reduce_all(tf.equal(stacked, stacked[0])),
    [
      (head + ", ".join(names)).replace("'", "`") + " have batch sizes",
      stacked,
    ],
  )


@dataclasses.dataclass(frozen=True)
class Capabilities:
  """What a backend supports, so callers and tests can check before running.

  `EmbeddingBackend` enforces the declarations: a table with another
  combiner or optimizer, or a sequence feature when `sequence_features` is
  False, is refused when the backend is constructed
  (`UnsupportedConfigError`); ids of another kind are refused by `lookup`
  (`UnsupportedInputError`); a backend that does not train raises
  `NotImplementedError` from `apply_gradients`. `backends.conformance`
  checks each declaration against NumPy.

  Attributes:
    combiners: table combiners it implements.
    optimizers: `tf.tpu.experimental.embedding` optimizer classes it applies.
    input_kinds: "dense", "sparse", "ragged" (`input_kind`).
    sequence_features: whether `max_sequence_length > 0` works.
    trains: False for lookup-only backends (serving).
    sharded_tables: tables are split across devices or hosts (else replicated).
    needs_tpu: it only runs under a TPUStrategy.
    quantization: whether it applies a table's `quantization_config` (TF's
      simulated quantization of the looked-up rows) as a TPU does.
    tpu_table_fields: whether it hands `TableConfig.layout` and
      `TableConfig.dtype` to a TPU (which checks them per engine); the
      others hold float32 tables they place themselves, and refuse both.
    layouts: it is built from the planner's per-table layouts (its
      constructor's `layouts`, `backends.layout.TableLayout`): it honours
      the requested placement, row layout, exchange and storage dtype.
    dynamic_vocabularies: it honours a layout's `vocabulary` (raw ids
      mapped to rows by an index with admission and eviction,
      `backends.vocabulary`; `map_ids`).
  """

  combiners: frozenset[str] = ALL_COMBINERS
  optimizers: frozenset[type] = frozenset(OPTIMIZER_CLASSES)
  input_kinds: frozenset[str] = ALL_INPUT_KINDS
  sequence_features: bool = True
  trains: bool = True
  sharded_tables: bool = False
  needs_tpu: bool = False
  quantization: bool = True
  tpu_table_fields: bool = False
  layouts: bool = False
  dynamic_vocabularies: bool = False


def table_names(tables: list[TableConfig]) -> dict[int, str]:
  """Names tables as TF's mid-level API does: their name, else `table_<i>`."""
  names = {}
  for i, table in enumerate(tables):
    names[id(table)] = table.name if table.name is not None else f"table_{i}"
  seen = {}
  for table in tables:
    name = names[id(table)]
    if name in seen:
      raise ValueError(
        f"two different TableConfig objects are both named {name!r}; table "
        "names must be unique. Features that share a table must share one "
        "TableConfig object (in gin: a scoped singleton or a name-keyed spec)."
      )
    seen[name] = table
  return names


class EmbeddingBackend(_tf_internal.AutoTrackable, metaclass=abc.ABCMeta):
  """Base class of every embedding backend.

  Subclasses set `name` and `capabilities`, implement `build`, `lookup`,
  `apply_gradients` and `embedding_tables`, and may override
  `unavailable_reason`, `input_options` and `preprocess`.

  Checkpoints: a backend is a `Trackable` whose children are `<table name>`
  and `<table name>/<slot name>`, the layout of TF's mid-level API (written to
  checkpoints as `<table name>.S<slot name>`), so `tf.train.Checkpoint(
  embedding=backend)` moves between backends and into
  `TPUEmbeddingForServing`.
  """

  name: ClassVar[str] = "base"
  capabilities: ClassVar[Capabilities] = Capabilities()
  #: The keyword options its constructor takes (`train.backend_options`).
  options: ClassVar[frozenset[str]] = frozenset({"bag_widths"})
  #: It restores SparseCore (TPUEmbeddingV2) checkpoints, whose tables are
  #: stacked and padded, by unstacking them (`backends.checkpoint`).
  unstacks_checkpoints: ClassVar[bool] = False

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    bag_widths: None | int | Mapping[str, int] = None,
  ):
    """Validates the configuration against what this backend supports.

    Args:
      feature_config: a nested structure of `FeatureConfig`.
      optimizer: the default embedding optimizer, used by tables whose
        `TableConfig.optimizer` is None.
      strategy: the strategy to build and run under; defaults to the current
        one (`tf.distribute.get_strategy()`).
      bag_widths: the most ids a bag of a non-sequence feature holds (an int
        for every feature, or feature path -> int): backends that need static
        shapes pad to it in `preprocess` and cut (and count) longer bags.
        Sequence features use `max_sequence_length`.

    Raises:
      BackendUnavailableError: this backend cannot run under `strategy`.
      UnsupportedConfigError: a table asks for a combiner or an optimizer the
        backend does not implement.
      ValueError: malformed configuration (e.g. duplicate table names).
    """
    self._strategy = strategy or tf.distribute.get_strategy()
    reason = self.unavailable_reason(self._strategy)
    if reason:
      raise BackendUnavailableError(
        f"embedding backend {self.name!r} cannot run here: {reason}"
      )
    # NoDependency: keep the user's containers as they are (not tracked
    # wrappers), so outputs packed like feature_config are plain dicts.
    self._feature_config = _tf_internal.NoDependency(feature_config)
    self._flat_features: list[tuple[str, FeatureConfig]] = []
    for path, feature in _tf_internal.flatten_with_joined_string_paths(
      feature_config
    ):
      if not isinstance(feature, FeatureConfig):
        raise TypeError(
          f"feature_config[{path!r}] is a {type(feature).__name__}; expected "
          "tf.tpu.experimental.embedding.FeatureConfig."
        )
      self._flat_features.append((path, feature))
    if not self._flat_features:
      raise ValueError(
        "feature_config is empty: give at least one FeatureConfig."
      )
    tables: list[TableConfig] = []
    for _, feature in self._flat_features:
      if all(feature.table is not t for t in tables):
        tables.append(feature.table)
    self._tables = tables
    self._names = table_names(tables)
    if not self.capabilities.sequence_features:
      for path, feature in self._flat_features:
        if feature.max_sequence_length:
          raise UnsupportedConfigError(
            f"feature {path!r} (table {self.table_name(feature.table)!r}) "
            f"has max_sequence_length={feature.max_sequence_length}, but the "
            f"{self.name!r} backend does not support sequence features; "
            "set max_sequence_length=0 (one combined activation per bag) or "
            "use a backend that supports them."
          )
    self._bag_widths = self._resolve_bag_widths(bag_widths)
    self._optimizers = {}
    for table in tables:
      opt = table.optimizer if table.optimizer is not None else optimizer
      self._check_table(table, opt)
      self._optimizers[self._names[id(table)]] = opt
    self._built = False

  # -- configuration -------------------------------------------------------

  def _resolve_bag_widths(self, bag_widths) -> dict[str, int | None]:
    paths = [path for path, _ in self._flat_features]
    if bag_widths is None or isinstance(bag_widths, int):
      widths = {p: bag_widths for p in paths}
    else:
      unknown = sorted(set(bag_widths) - set(paths))
      if unknown:
        raise ValueError(
          f"bag_widths names unknown features {unknown}; features are {paths}."
        )
      widths = {p: bag_widths.get(p) for p in paths}
    for path, width in widths.items():
      if width is not None and (not isinstance(width, int) or width < 1):
        raise ValueError(
          f"bag_widths[{path!r}] = {width!r}; expected an int >= 1."
        )
    return widths

  def bag_width(self, path: str) -> int | None:
    """The static bag width of feature `path` (None: dynamic)."""
    return self._bag_widths[path]

  def _check_table(self, table: TableConfig, opt: Any) -> None:
    name = self.table_name(table)
    caps = self.capabilities
    self._check_table_fields(table, name)
    if (
      not isinstance(table.combiner, str)
      or table.combiner not in caps.combiners
    ):
      raise UnsupportedConfigError(
        f"table {name!r}: combiner {table.combiner!r} is not supported by "
        f"the {self.name!r} backend; use one of {sorted(caps.combiners)}."
      )
    if opt is None:
      if caps.trains:
        raise ValueError(
          f"table {name!r} has no optimizer: set TableConfig.optimizer or "
          "pass optimizer= (e.g. tf.tpu.experimental.embedding.Adagrad(0.05))."
        )
      return
    if not isinstance(opt, OPTIMIZER_CLASSES):
      raise UnsupportedConfigError(
        f"table {name!r}: optimizer {type(opt).__name__} is not a "
        "tf.tpu.experimental.embedding optimizer; use one of "
        f"{', '.join(c.__name__ for c in OPTIMIZER_CLASSES)}."
      )
    if caps.trains and type(opt) not in caps.optimizers:
      raise UnsupportedConfigError(
        f"table {name!r}: the {self.name!r} backend does not implement "
        f"{type(opt).__name__}; it supports "
        f"{', '.join(sorted(c.__name__ for c in caps.optimizers))}."
      )

  def _check_table_fields(self, table: TableConfig, name: str) -> None:
    """Refuses a TF table field this backend would otherwise ignore."""
    caps = self.capabilities
    if table.quantization_config is not None:
      if not caps.quantization:
        raise UnsupportedConfigError(
          f"table {name!r}: the {self.name!r} backend does not apply "
          "TableConfig.quantization_config (simulated quantization of the "
          "looked-up rows); it would train another model than a TPU does. "
          "Remove it, or use a backend that applies it (tensorcore)."
        )
      problem = quantization.problem(table.quantization_config)
      if problem:
        raise UnsupportedConfigError(f"table {name!r}: {problem}")
    if caps.tpu_table_fields:
      return
    if table.layout is not None:
      raise UnsupportedConfigError(
        f"table {name!r}: TableConfig.layout is a SparseCore table layout "
        f"(TPUEmbeddingV2); the {self.name!r} backend places its tables "
        "itself (its plan) and would ignore it. Set layout=None."
      )
    if table.dtype != tf.float32:
      raise UnsupportedConfigError(
        f"table {name!r}: TableConfig.dtype={table.dtype.name}; the "
        f"{self.name!r} backend holds float32 tables (for bfloat16 or "
        "float16 rows: EmbeddingPlacement.table_dtype, a TableLayout's dtype). "
        "Use float32."
      )

  @classmethod
  def vocabulary_problem(cls, table: str, vocabulary: Any) -> str | None:
    """Why this backend cannot honour `vocabulary` (a `DynamicVocabulary`
    or `HashedIds`) for table `table`, naming both, or None. Asked by the
    planner and the constructor before any work; only backends with
    `Capabilities.dynamic_vocabularies` are asked. Default: any."""
    del table, vocabulary
    return None

  @classmethod
  def unavailable_reason(cls, strategy: tf.distribute.Strategy) -> str | None:
    """Why this backend cannot run under `strategy`, or None if it can."""
    del strategy
    return None

  @classmethod
  def plan_tables(
    cls, request: table_plan.PlanRequest
  ) -> table_plan.BackendPlan:
    """Where this backend would put the requested tables, and why.

    The planner's question (`recsys.planning`, `recsys info`): each table's
    split over the devices, its bytes per device and the reason, asked of
    the class before anything is built. The default holds every table
    whole on each device; backends that split tables answer for
    themselves.
    """
    return table_plan.BackendPlan(
      table_plan.whole_tables(request, cls.name),
      advice=table_plan.holds_every_table_whole(cls.name),
    )

  def layouts(self) -> dict[str, layout.TableLayout]:
    """Table name -> where its rows live and how, as this backend holds
    them (built or not). The default: each table whole on every device,
    in its `TableConfig.dtype`."""
    return {
      self.table_name(t): layout.TableLayout(dtype=t.dtype.name)
      for t in self._tables
    }

  @property
  def feature_config(self) -> Any:
    return self._feature_config

  @property
  def lookup_only(self) -> bool:
    """Whether this backend holds the tables alone, to look up (no slots,
    no training): a checkpoint's slots are then accepted and left unread
    (`backends.checkpoint.verify_compatible`)."""
    return not self.capabilities.trains

  @property
  def strategy(self) -> tf.distribute.Strategy:
    return self._strategy

  @property
  def tables(self) -> list[TableConfig]:
    """Tables in the order of their first use in the flattened features."""
    return list(self._tables)

  def table_name(self, table: TableConfig) -> str:
    return self._names[id(table)]

  def feature_table_names(self) -> list[str]:
    """Per feature, in feature order, the name of its table."""
    return [self.table_name(f.table) for _, f in self._flat_features]

  def optimizer_for(self, table: TableConfig) -> Any:
    """The embedding optimizer that applies to `table`."""
    return self._optimizers[self.table_name(table)]

  # -- lifecycle -------------------------------------------------------------

  def _maybe_build(self) -> None:
    """Builds on first use, also from inside a replica function.

    TF's V0 builds lazily too: its documented loop first touches
    `embedding_tables` inside `strategy.run`; `build` then runs once for
    every replica, in cross-replica context (`base.cross_replica_build`).
    """
    if not self._built:
      self.build()

  @abc.abstractmethod
  def build(self) -> None:
    """Creates tables and optimizer slots (call under `strategy.scope()`)."""

  @property
  @abc.abstractmethod
  def embedding_tables(self) -> dict[TableConfig, tf.Variable]:
    """The table variables, keyed by `TableConfig`."""

  @abc.abstractmethod
  def lookup(
    self, features: Any, weights: Any | None = None, training: bool = False
  ) -> Any:
    """Looks up and combines embeddings; returns the structure of features."""

  def apply_gradients(self, activation_gradients: Any) -> None:
    """Applies each table's optimizer given d(loss)/d(activations).

    Must follow a `lookup(..., training=True)` in the same step; a second
    training lookup before it raises `backends.pending.UnappliedGradientsError`
    (gradients that are never applied would leave the tables untrained).
    Backends that can leave a step out take `apply_if` too (a scalar bool
    tensor; False: the tables stay), as `recsys.layers.Embedding` needs
    under Keras's loss scaling.
    """
    raise NotImplementedError(
      f"the {self.name!r} backend is lookup-only and cannot train."
    )

  def abandon_training_lookup(self) -> None:
    """Drops this replica's training lookup on purpose: a step left out.

    A training lookup must be followed by `apply_gradients` (a lookup
    whose gradients are never applied is an error at the next one); a
    training loop that skips a step, e.g. on a non-finite loss, says so.
    """

  def raise_for_invalid_inputs(self) -> None:
    """Raises for bad ids or weights that compiled steps could only count.

    A compiled step cannot raise; backends that leave such inputs out of it
    report them here (call it after steps, before saving). Default: nothing.
    """

  def narrow_counts(self) -> dict[str, int]:
    """Table -> the values its updates saturated so far, for the tables
    stored narrow (`backends.storage.narrow`). Default: no narrow tables."""
    return {}

  def __call__(
    self, features: Any, weights: Any | None = None, training: bool = False
  ) -> Any:
    return self.lookup(features, weights, training=training)

  def input_options(self) -> tf.distribute.InputOptions:
    """The `InputOptions` for `strategy.distribute_datasets_from_function`."""
    return tf.distribute.InputOptions()

  def preprocess(
    self, features: Any, weights: Any | None = None
  ) -> tuple[Any, Any | None]:
    """Host-side work to run in the input pipeline (e.g. static padding)."""
    return features, weights

  #: The dynamic-vocabulary tables' indices and their mapping
  #: (`backends.vocabulary.stage.VocabularyStage`), made by `build()` in a
  #: backend with such tables; None: every table's ids are its rows.
  _stage: Any = None

  def dynamic_tables(self) -> dict[str, Any]:
    """Dynamic-vocabulary table name -> its index
    (`backends.vocabulary.VocabularyIndex`); empty when every table's ids
    are its rows (the default)."""
    if not self.capabilities.dynamic_vocabularies:
      return {}
    self._maybe_build()
    return dict(self._stage.indices) if self._stage is not None else {}

  def map_ids(self, features: Any, training: bool = False) -> Any:
    """`features` with each dynamic-vocabulary table's raw ids made rows.

    Call it on every batch before `lookup` when `dynamic_tables()` is not
    empty, never inside an XLA-compiled step or a TPU's replica step: for
    training in cross-replica context on the distributed batch (the
    Trainer's way, a TPU's too) or in a replica function (it updates the
    indices once for every replica's ids, `backends.vocabulary.stage`);
    for evaluation (`training=False`) likewise, the indices unchanged.
    Other features pass untouched; without dynamic tables `features` are
    returned as they are.
    """
    if not self.capabilities.dynamic_vocabularies:
      return features
    self._maybe_build()
    if self._stage is None:
      return features
    flat = self._flatten_like_config(features, "features")
    mapped = self._stage.map(flat, training)
    return tf.nest.pack_sequence_as(self._feature_config, mapped)

  def _pack_inputs(
    self, flat_features: list[Any], flat_weights: list[Any]
  ) -> tuple[Any, Any | None]:
    """`(features, weights)` shaped like `feature_config` (weights or None)."""
    features = tf.nest.pack_sequence_as(self._feature_config, flat_features)
    if all(w is None for w in flat_weights):
      return features, None
    return features, tf.nest.pack_sequence_as(
      self._feature_config, flat_weights
    )

  def slot_variables(self) -> dict[str, dict[str, tf.Variable]]:
    """Optimizer slots by table name and TF slot name (may be empty)."""
    return {}

  def _flatten_like_config(self, structure: Any, what: str) -> list[Any]:
    """Flattens `structure` to one entry per feature, in feature order.

    Entries may themselves be structures (e.g. `PaddedBags`); a structure that
    does not match `feature_config` raises naming missing and extra keys.
    """
    try:
      flat = _tf_internal.flatten_up_to(self._feature_config, structure)
      if len(flat) != len(self._flat_features):
        raise ValueError("length mismatch")
    except (ValueError, TypeError) as e:
      expected = [p for p, _ in self._flat_features]
      try:
        got = [
          p for p, _ in _tf_internal.flatten_with_joined_string_paths(structure)
        ]
      except Exception:  # noqa: BLE001 - best effort for the message
        got = []

      def covered(g):
        return any(g == p or g.startswith(p + "/") for p in expected)

      missing = sorted(
        p
        for p in expected
        if not any(g == p or g.startswith(p + "/") for g in got)
      )
      extra = sorted(g for g in got if not covered(g))
      raise ValueError(
        f"{what} do not match feature_config: missing {missing or 'nothing'}, "
        f"unexpected {extra or 'nothing'}; expected exactly "
        f"{sorted(expected)}."
      ) from e
    if what == "features":
      self._check_input_kinds(flat)
      check_batch_sizes(
        [
          f"{path!r} (table {self.table_name(feature.table)!r})"
          for path, feature in self._flat_features
        ],
        flat,
      )
    return flat

  def _check_input_kinds(self, flat: list[Any]) -> None:
    """Refuses ids of a kind `capabilities.input_kinds` does not declare."""
    kinds = self.capabilities.input_kinds
    for (path, feature), ids in zip(self._flat_features, flat):
      kind = input_kind(ids)
      if kind is not None and kind not in kinds:
        raise UnsupportedInputError(
          f"feature {path!r} (table {self.table_name(feature.table)!r}) got "
          f"{kind} ids, but the {self.name!r} backend takes only "
          f"{', '.join(sorted(kinds))} ids (its capabilities.input_kinds); "
          "convert them (e.g. tf.sparse.to_dense, RaggedTensor.to_tensor) "
          "or use a backend that takes them."
        )
