"""Turns a data source's `FeatureSpec`s into the embedding `feature_config`.

Every feature becomes a `tf.tpu.experimental.embedding.FeatureConfig`; features
whose specs name the same `table` share ONE `TableConfig` object (the TPU API
identifies shared tables by object identity). Embedding settings (dim,
combiner, initializer, optimizer) apply to every table unless a per-table
override says otherwise.

Example:
  >>> from recsys.feature_spec import FeatureSpec
  >>> specs = [FeatureSpec("user", 943), FeatureSpec("item", 1682),
  ...          FeatureSpec("history", 1682, multi_hot=True, table="item")]
  >>> config = feature_config(specs, EmbeddingSettings(dim=16))
  >>> config["item"].table is config["history"].table
  True
"""

import dataclasses
import math
import numbers
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import gin
import numpy as np

from backends import base as backends_base
from backends import suggest
from recsys import ranges
from recsys._keras import keras, tf
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec

embedding = tf.tpu.experimental.embedding

_OVERRIDE_KEYS = ("dim", "combiner", "initializer", "optimizer")
#: Per-table only: the rows of a table fed raw ids (its capacity).
_CAPACITY_KEY = "vocabulary_size"
#: The table combiners, in the order error messages list them.
_COMBINERS = tuple(
  c for c in ("sum", "mean", "sqrtn") if c in backends_base.ALL_COMBINERS
)
#: The `tf.tpu.experimental.embedding` optimizer classes, by name (the list
#: is `backends.base.OPTIMIZER_CLASSES`).
EMBEDDING_OPTIMIZERS = {
  cls.__name__: cls for cls in backends_base.OPTIMIZER_CLASSES
}


class FeatureConfigError(SettingsError):
  """The feature specs and embedding settings do not make a valid config."""


@gin.register
@dataclasses.dataclass
class EmbeddingSettings:
  """How every table is embedded, with per-table overrides.

  Attributes:
    dim: embedding dimension D of every table.
    combiner: "sum", "mean" or "sqrtn", how multi-hot bags are combined.
    initializer: callable `(shape, dtype) -> Tensor` for the table rows, e.g.
      `keras.initializers.TruncatedNormal(stddev=0.05)`; None -> TF's default
      (truncated normal with stddev 1/sqrt(dim)).
    optimizer: a `tf.tpu.experimental.embedding` optimizer for every table;
      None -> the trainer's `embedding_optimizer`.
    overrides: table name -> {"dim", "combiner", "initializer", "optimizer"}
      to override the settings above for that table, e.g.
      `{"item": {"dim": 32, "optimizer": @embedding.Adam()}}` in gin; and,
      for a table fed raw ids (`FeatureSpec.raw_ids`: a dynamic vocabulary
      or hashing maps them), "vocabulary_size": its rows, the capacity
      (default: what the data source suggests), e.g. `{"user_id":
      {"vocabulary_size": 600}}`.
  """

  dim: ranges.PositiveInt = 16
  combiner: Annotated[str, ranges.Choice(_COMBINERS)] = "mean"
  initializer: Callable[..., Any] | None = None
  optimizer: Any | None = None
  overrides: Mapping[str, Mapping[str, Any]] = dataclasses.field(
    default_factory=dict
  )

  def __post_init__(self) -> None:
    """`dim` and `combiner` within their declared ranges (`recsys.ranges`);
    the overrides are checked per table (`feature_config`)."""
    ranges.check_fields(self)

  def for_table(self, table: str) -> dict[str, Any]:
    """The dim/combiner/initializer/optimizer of `table` after overrides."""
    values = {key: getattr(self, key) for key in _OVERRIDE_KEYS}
    override = dict(self.overrides.get(table, {}))
    valid = [*_OVERRIDE_KEYS, _CAPACITY_KEY]
    unknown = sorted(set(override) - set(valid))
    if unknown:
      raise FeatureConfigError(
        f"embedding override for table {table!r} has unknown keys "
        f"{unknown}; valid keys: {valid}."
      )
    values.update(override)
    return values


def _did_you_mean(name: str, valid: Sequence[str]) -> str:
  return suggest.did_you_mean(name, valid, cutoff=0.5)


def _gin_class_name(cls: type) -> str:
  """The class name under gin's generated subclass (as `@embedding.Adam`)."""
  for klass in cls.__mro__:
    if klass.__module__ != "gin.config" and not klass.__name__.startswith("_"):
      return klass.__name__
  return cls.__name__


def check_embedding_optimizer(optimizer: Any, where: str) -> None:
  """Checks an embedding optimizer setting; explains the usual gin mistakes.

  Args:
    optimizer: None (use the default) or a `tf.tpu.experimental.embedding`
      optimizer instance.
    where: what set it, for the message (e.g. "train.embedding_optimizer" or
      "EmbeddingSettings.overrides['item']['optimizer']").

  Raises:
    FeatureConfigError: the class instead of an instance (gin
      `@embedding.Adam` without parentheses), a name string, a Keras
      optimizer, or a learning rate that is not a number >= 0 or a
      zero-argument callable.
  """
  if optimizer is None:
    return
  valid = ", ".join(f"@embedding.{n}()" for n in EMBEDDING_OPTIMIZERS)
  if isinstance(optimizer, type):
    name = _gin_class_name(optimizer)
    if issubclass(optimizer, tuple(EMBEDDING_OPTIMIZERS.values())):
      raise FeatureConfigError(
        f"{where} is the class {name}, not an optimizer: in gin write "
        f"@embedding.{name}() with parentheses (an instance), not "
        f"@embedding.{name}."
      )
    raise FeatureConfigError(
      f"{where} is the class {name}; embedding tables take an instance of a "
      f"tf.tpu.experimental.embedding optimizer: {valid}."
    )
  if isinstance(optimizer, str):
    hint = _did_you_mean(optimizer, list(EMBEDDING_OPTIMIZERS))
    raise FeatureConfigError(
      f"{where} = {optimizer!r} is a string; give an optimizer instance, "
      f"e.g. @embedding.Adagrad() in gin.{hint} Valid: {valid}."
    )
  if not isinstance(optimizer, tuple(EMBEDDING_OPTIMIZERS.values())):
    kind = type(optimizer)
    keras_like = "keras" in kind.__module__ or hasattr(
      optimizer, "apply_gradients"
    )
    raise FeatureConfigError(
      f"{where} is a {kind.__module__}.{kind.__name__}"
      + (
        " (a Keras optimizer, which trains dense layers: set it as "
        "train.dense_optimizer)"
        if keras_like
        else ""
      )
      + f"; embedding tables take a tf.tpu.experimental.embedding optimizer: "
      f"{valid}."
    )
  lr = getattr(optimizer, "learning_rate", None)
  if callable(lr):
    return
  if (
    isinstance(lr, bool)
    or not isinstance(lr, numbers.Real)
    or not math.isfinite(lr)
    or lr < 0
  ):
    raise FeatureConfigError(
      f"{where}: {type(optimizer).__name__}.learning_rate = {lr!r}; expected "
      "a finite number >= 0, or a zero-argument callable / Keras "
      "LearningRateSchedule."
    )


def table_name(spec: FeatureSpec) -> str:
  """The table a feature embeds into: `spec.table`, else its own name."""
  return spec.table or spec.name


def table_seed(seed: int, table: str) -> int:
  """A table's initializer seed: a function of the run seed and its name only
  (adding or reordering tables leaves the others' initial values alone)."""
  return int(
    np.random.SeedSequence(
      [int(seed) & 0xFFFFFFFF, zlib.crc32(table.encode("utf-8"))]
    ).generate_state(1)[0]
    & 0x7FFFFFFF
  )


def seeded_initializer(
  initializer: Callable[..., Any] | None, dim: int, seed: int, table: str
) -> Callable[..., Any] | None:
  """The table's own initializer, seeded from the run seed and its name.

  One gin-built initializer instance is shared by every table; an unseeded
  Keras initializer called twice returns identical values, so same-shape
  tables would start equal. Each table gets a copy with its own seed: a
  Keras initializer from its config; None (TF's default) as its
  `TruncatedNormal(stddev=1/sqrt(dim))`. Other callables are kept (they own
  their randomness).
  """
  if initializer is None:
    return keras.initializers.TruncatedNormal(
      stddev=1 / math.sqrt(dim), seed=table_seed(seed, table)
    )
  get_config = getattr(initializer, "get_config", None)
  if callable(get_config) and "seed" in get_config():
    initializer_cls: Any = type(initializer)
    return initializer_cls.from_config(
      {**get_config(), "seed": table_seed(seed, table)}
    )
  return initializer


def feature_config(
  specs: Sequence[FeatureSpec],
  settings: EmbeddingSettings | None = None,
  seed: int | None = None,
) -> dict[str, Any]:
  """Builds the feature_config dict the embedding backends take.

  Args:
    specs: the data source's feature specs, in its order.
    settings: embedding settings; defaults to `EmbeddingSettings()`.
    seed: the run seed; when given every table gets its own seeded
      initializer (`seeded_initializer`), independent of the others and
      reproducible from the seed.

  Returns:
    Dict feature name -> `FeatureConfig`, in the order of `specs`. Features
    with the same `table_name(spec)` share one `TableConfig`; a spec with
    `sequence_length=L > 0` gets `max_sequence_length=L` (activations
    `[B, L, D]`), any other `[B, D]`.

  Raises:
    FeatureConfigError: duplicate feature names, features sharing a table
      with different vocabulary sizes, overrides naming unknown tables (or
      a feature of a shared table) or keys, an unknown combiner, a
      non-positive dim, or an optimizer setting that is not an embedding
      optimizer instance (see `check_embedding_optimizer`).
  """
  settings = settings if settings is not None else EmbeddingSettings()
  specs = list(specs)
  if not specs:
    raise FeatureConfigError(
      "no feature specs: the data source declares no "
      "categorical features to embed."
    )
  names = [s.name for s in specs]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise FeatureConfigError(f"duplicate feature names {duplicates} in specs.")

  by_table: dict[str, FeatureSpec] = {}
  for spec in specs:
    name = table_name(spec)
    first = by_table.setdefault(name, spec)
    if first.vocabulary_size != spec.vocabulary_size:
      raise FeatureConfigError(
        f"features {first.name!r} and {spec.name!r} share table {name!r} "
        f"but have vocabulary sizes {first.vocabulary_size} and "
        f"{spec.vocabulary_size}; shared tables need one vocabulary size."
      )
  _check_override_tables(settings, specs, by_table)
  check_embedding_optimizer(settings.optimizer, "EmbeddingSettings.optimizer")

  tables: dict[str, Any] = {}
  for name, spec in by_table.items():
    values = settings.for_table(name)
    dim, combiner = values["dim"], values["combiner"]
    if not isinstance(dim, int) or dim < 1:
      raise FeatureConfigError(
        f"table {name!r}: dim must be a positive int, got {dim!r}."
      )
    if combiner not in _COMBINERS:
      raise FeatureConfigError(
        f"table {name!r}: combiner must be one of {list(_COMBINERS)}, got "
        f"{combiner!r}.{_did_you_mean(combiner, _COMBINERS)}"
      )
    if name in settings.overrides:
      check_embedding_optimizer(
        values["optimizer"],
        f"EmbeddingSettings.overrides[{name!r}]['optimizer']",
      )
    initializer = values["initializer"]
    if seed is not None:
      initializer = seeded_initializer(initializer, dim, seed, name)
    tables[name] = embedding.TableConfig(
      vocabulary_size=_rows(name, spec, values),
      dim=dim,
      initializer=initializer,
      optimizer=values["optimizer"],
      combiner=combiner,
      name=name,
    )

  return {
    spec.name: embedding.FeatureConfig(
      table=tables[table_name(spec)],
      max_sequence_length=spec.sequence_length,
      name=spec.name,
    )
    for spec in specs
  }


def _rows(table: str, spec: FeatureSpec, values: Mapping[str, Any]) -> int:
  """The table's rows: the spec's vocabulary size, or for a table fed raw
  ids the capacity its override gives.

  Raises:
    FeatureConfigError: a capacity for a table whose ids are its rows (a
      smaller one would refuse ids the data delivers), or one that is not
      a positive int.
  """
  rows = values.get(_CAPACITY_KEY)
  if rows is None:
    return spec.vocabulary_size
  where = f"EmbeddingSettings.overrides[{table!r}][{_CAPACITY_KEY!r}]"
  if not getattr(spec, "raw_ids", False):
    raise FeatureConfigError(
      f"{where} = {rows!r}, but table {table!r}'s ids are its rows (0 to "
      f"{spec.vocabulary_size - 1}, from the data): only a table fed raw ids "
      "(FeatureSpec.raw_ids) takes a capacity."
    )
  if isinstance(rows, bool) or not isinstance(rows, numbers.Integral):
    rows = 0
  if rows < 1:
    raise FeatureConfigError(
      f"{where} = {values[_CAPACITY_KEY]!r}; use a positive int (the rows "
      "the table's raw ids share)."
    )
  return int(rows)


def specs_from_feature_config(
  config: Mapping[str, Any],
  multi_hot: Mapping[str, int] | None = None,
) -> list[FeatureSpec]:
  """The `FeatureSpec`s of an existing feature_config dict (its inverse).

  For users who already have TF's `FeatureConfig`s: the models and the
  Trainer read specs (names, vocabularies, sequence lengths, shared tables).

  Args:
    config: dict feature name -> `FeatureConfig` (the names the data uses).
    multi_hot: feature name -> the most ids a bag holds, for features given
      as `RaggedTensor`/`SparseTensor` bags (default: every feature is one
      id per example, or a sequence of `max_sequence_length`).

  Raises:
    FeatureConfigError: `config` is not a flat dict of `FeatureConfig`, or
      `multi_hot` names unknown features.
  """
  if not isinstance(config, Mapping) or not config:
    raise FeatureConfigError(
      f"feature_config is a {type(config).__name__}; expected a non-empty "
      "dict feature name -> tf.tpu.experimental.embedding.FeatureConfig."
    )
  multi_hot = dict(multi_hot or {})
  unknown = sorted(set(multi_hot) - set(config))
  if unknown:
    raise FeatureConfigError(
      f"multi_hot names unknown features {unknown}; "
      f"features are {sorted(config)}."
    )
  specs = []
  for name, feature in config.items():
    if not isinstance(feature, embedding.FeatureConfig):
      raise FeatureConfigError(
        f"feature_config[{name!r}] is a {type(feature).__name__}; expected "
        "tf.tpu.experimental.embedding.FeatureConfig."
      )
    table = feature.table
    specs.append(
      FeatureSpec(
        name=name,
        vocabulary_size=table.vocabulary_size,
        multi_hot=name in multi_hot,
        max_ids=int(multi_hot.get(name, 1)),
        sequence_length=int(feature.max_sequence_length or 0),
        table=table.name if table.name != name else None,
      )
    )
  return specs


def _check_override_tables(
  settings: EmbeddingSettings,
  specs: list[FeatureSpec],
  by_table: Mapping[str, FeatureSpec],
) -> None:
  """Overrides must name tables; feature names explained, typos suggested."""
  unknown = sorted(set(settings.overrides) - set(by_table))
  if not unknown:
    return
  table_of = {spec.name: table_name(spec) for spec in specs}
  sharing: dict[str, list[str]] = {}
  for spec in specs:
    sharing.setdefault(table_name(spec), []).append(spec.name)
  hints = []
  for name in unknown:
    if name in table_of:
      table = table_of[name]
      hints.append(
        f"{name!r} is a feature of the shared table {table!r} (with "
        f"{sharing[table]}); features sharing a table share its dim, "
        f"combiner and optimizer, so override the table: {table!r}."
      )
    else:
      hint = _did_you_mean(name, sorted(by_table)).strip()
      if hint:
        hints.append(f"{name!r}: {hint}")
  raise FeatureConfigError(
    f"embedding overrides name unknown tables {unknown}; tables are "
    f"{sorted(by_table)}." + ("".join(" " + h for h in hints))
  )


def dims(config: Mapping[str, Any]) -> dict[str, int]:
  """Feature name -> embedding dim D of its table."""
  return {name: f.table.dim for name, f in config.items()}


__all__ = [
  "EMBEDDING_OPTIMIZERS",
  "EmbeddingSettings",
  "FeatureConfigError",
  "check_embedding_optimizer",
  "dims",
  "feature_config",
  "specs_from_feature_config",
  "table_name",
]
