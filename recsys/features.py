"""Turns a data source's `FeatureSpec`s into the embedding `feature_config`.

Every feature becomes a `tf.tpu.experimental.embedding.FeatureConfig`; features
whose specs name the same `table` share ONE `TableConfig` object (the TPU API
identifies shared tables by object identity). Embedding settings (dim,
combiner, initializer, optimizer) apply to every table unless a per-table
override says otherwise.

Example:
  >>> from recsys.data.spec import FeatureSpec
  >>> specs = [FeatureSpec("user", 943), FeatureSpec("item", 1682),
  ...          FeatureSpec("history", 1682, multi_hot=True, table="item")]
  >>> config = feature_config(specs, EmbeddingSettings(dim=16))
  >>> config["item"].table is config["history"].table
  True
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import gin

from recsys._keras import tf
from recsys.data.spec import FeatureSpec

embedding = tf.tpu.experimental.embedding

_OVERRIDE_KEYS = ("dim", "combiner", "initializer", "optimizer")
_COMBINERS = ("sum", "mean", "sqrtn")


class FeatureConfigError(ValueError):
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
      `{"item": {"dim": 32, "optimizer": @embedding.Adam()}}` in gin.
  """
  dim: int = 16
  combiner: str = "mean"
  initializer: Optional[Callable[..., Any]] = None
  optimizer: Optional[Any] = None
  overrides: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=dict)

  def for_table(self, table: str) -> Dict[str, Any]:
    """The dim/combiner/initializer/optimizer of `table` after overrides."""
    values = {key: getattr(self, key) for key in _OVERRIDE_KEYS}
    override = dict(self.overrides.get(table, {}))
    unknown = sorted(set(override) - set(_OVERRIDE_KEYS))
    if unknown:
      raise FeatureConfigError(
          f"embedding override for table {table!r} has unknown keys "
          f"{unknown}; valid keys: {list(_OVERRIDE_KEYS)}.")
    values.update(override)
    return values


def table_name(spec: FeatureSpec) -> str:
  """The table a feature embeds into: `spec.table`, else its own name."""
  return spec.table or spec.name


def feature_config(specs: Sequence[FeatureSpec],
                   settings: Optional[EmbeddingSettings] = None,
                   ) -> Dict[str, "embedding.FeatureConfig"]:
  """Builds the feature_config dict the embedding backends take.

  Args:
    specs: the data source's feature specs, in its order.
    settings: embedding settings; defaults to `EmbeddingSettings()`.

  Returns:
    Dict feature name -> `FeatureConfig`, in the order of `specs`. Features
    with the same `table_name(spec)` share one `TableConfig`; a spec with
    `sequence_length=L > 0` gets `max_sequence_length=L` (activations
    `[B, L, D]`), any other `[B, D]`.

  Raises:
    FeatureConfigError: duplicate feature names, features sharing a table
      with different vocabulary sizes, overrides naming unknown tables or
      keys, an unknown combiner or a non-positive dim.
  """
  settings = settings if settings is not None else EmbeddingSettings()
  specs = list(specs)
  if not specs:
    raise FeatureConfigError("no feature specs: the data source declares no "
                             "categorical features to embed.")
  names = [s.name for s in specs]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise FeatureConfigError(f"duplicate feature names {duplicates} in specs.")

  by_table: Dict[str, FeatureSpec] = {}
  for spec in specs:
    name = table_name(spec)
    first = by_table.setdefault(name, spec)
    if first.vocabulary_size != spec.vocabulary_size:
      raise FeatureConfigError(
          f"features {first.name!r} and {spec.name!r} share table {name!r} "
          f"but have vocabulary sizes {first.vocabulary_size} and "
          f"{spec.vocabulary_size}; shared tables need one vocabulary size.")
  unknown = sorted(set(settings.overrides) - set(by_table))
  if unknown:
    raise FeatureConfigError(
        f"embedding overrides name unknown tables {unknown}; tables are "
        f"{sorted(by_table)}.")

  tables: Dict[str, embedding.TableConfig] = {}
  for name, spec in by_table.items():
    values = settings.for_table(name)
    dim, combiner = values["dim"], values["combiner"]
    if not isinstance(dim, int) or dim < 1:
      raise FeatureConfigError(
          f"table {name!r}: dim must be a positive int, got {dim!r}.")
    if combiner not in _COMBINERS:
      raise FeatureConfigError(
          f"table {name!r}: combiner must be one of {list(_COMBINERS)}, got "
          f"{combiner!r}.")
    tables[name] = embedding.TableConfig(
        vocabulary_size=spec.vocabulary_size, dim=dim,
        initializer=values["initializer"], optimizer=values["optimizer"],
        combiner=combiner, name=name)

  return {
      spec.name: embedding.FeatureConfig(
          table=tables[table_name(spec)],
          max_sequence_length=spec.sequence_length,
          name=spec.name)
      for spec in specs
  }


def dims(config: Mapping[str, "embedding.FeatureConfig"]) -> Dict[str, int]:
  """Feature name -> embedding dim D of its table."""
  return {name: f.table.dim for name, f in config.items()}


__all__ = ["EmbeddingSettings", "FeatureConfigError", "dims", "feature_config",
           "table_name"]
