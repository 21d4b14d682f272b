"""The serving backend (TF's `TPUEmbeddingForServing`) and SavedModel export.

`ServingEmbedding` is lookup-only and runs on CPU or GPU under any non-TPU
strategy. It restores checkpoints written by every training backend (the
layout of TF's mid-level API: `<table>` and `<table>.S<slot>`; SparseCore's
stacked tables are unstacked by TF on restore), and its lookups follow the
project's output-shape convention, which TF's serving lookup does not for
dense ids: TF returns `[B, N, D]` for dense `[B, N]` ids (even `N == 1`)
where every backend returns the bag combined with the table's combiner,
`[B, D]`. Dense `[B, N]` ids are therefore looked up as a ragged bag of `N`
ids per row.

`serving_lookup` is that lookup as a function of any tables (TF's
`serving_embedding_lookup` with the convention): `ServingEmbedding.lookup`
runs it on its own tables, and callers run it on a subset of the features
(one tower of a retrieval model) or in place on a training backend's tables.

`export_saved_model` writes a model and a serving embedding to a SavedModel
whose `serve(features)` function needs neither this package nor a TPU.

Example:
  >>> emb = ServingEmbedding(feature_config)            # no slots for export
  >>> restore(emb, "/tmp/model/ckpt-100")               # backends.checkpoint
  >>> export_saved_model("/tmp/export", emb, model, signature)
  >>> emb = ServingEmbedding.from_backend(trained)      # or: copy a backend
"""

import collections.abc
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.tpu.experimental import embedding

from backends import _tf_internal, base, hardware, quantization
from backends.mid_level import common as mid_level


class ServingEmbedding(mid_level.MidLevelBackend):
  """Lookup-only embedding for CPU/GPU inference (`TPUEmbeddingForServing`).

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: optional embedding optimizer. Without one (and without
      per-table optimizers) no slot variables are created — what an export
      wants. With one, the slots of TF's layout exist too, so a training
      checkpoint round-trips through this backend slots included.
    strategy: any non-TPU strategy (default: the current one).

  Example:
    >>> table = tf.tpu.experimental.embedding.TableConfig(23, 7, name="t")
    >>> feature = tf.tpu.experimental.embedding.FeatureConfig(table)
    >>> emb = ServingEmbedding({"f": feature})
    >>> emb.build()
    >>> emb.lookup({"f": tf.constant([[1, 2], [3, 4]])})["f"].shape
    TensorShape([2, 7])
  """

  name = "serving"
  capabilities = base.Capabilities(trains=False)
  unstacks_checkpoints = True  # TF's TPUEmbeddingForServing unstacks them
  options = base.EmbeddingBackend.options | {"restore_only"}

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    restore_only: bool = False,
    **options: Any,
  ):
    """As `EmbeddingBackend`, and `restore_only`: built to restore a
    checkpoint's tables into (`recsys export`), it holds the tables alone,
    no slots whatever the optimizer, as zeros until restored (drawing a
    4M x 16 table from a truncated normal held ~3 copies of it at once)."""
    super().__init__(feature_config, optimizer, strategy, **options)
    self._restore_only = base.checked_restore_only(restore_only)

  @classmethod
  def unavailable_reason(cls, strategy: tf.distribute.Strategy) -> str | None:
    feature = hardware.embedding_feature(strategy)
    if feature is not None:
      return (
        f"{type(strategy).__name__} is a TPU strategy (embedding_feature="
        f"{feature.name}); TPUEmbeddingForServing runs on CPU/GPU only. "
        "Serve under the default strategy, or use 'tensorcore' for "
        "lookups on a TPU"
      )
    return None

  def _create_mid_level(self) -> Any:
    config, tables = mid_level.tf_feature_config(self)
    if self._restore_only:
      for table in tables.values():
        table.initializer = tf.zeros_initializer()
        table.optimizer = None
    return embedding.TPUEmbeddingForServing(config, optimizer=None)

  def replicated_table_variables(self) -> list[tf.Variable]:
    """The built tables (and slots, with an optimizer): restored from the
    Trainer's checkpoints by row chunks, not whole
    (`backends.storage.row_sharded_checkpoint.row_sliced`). Unbuilt: none
    (a restore before `build()` fills the variables as TF creates them)."""
    if not self._built:
      return []
    return [
      variable
      for variables in self._variables_by_table().values()
      for variable in variables.values()
    ]

  def lookup(
    self, features: Any, weights: Any | None = None, training: bool = False
  ) -> Any:
    """Looks up and combines every feature (see `backends.base` for shapes).

    Args:
      features: the structure of `feature_config` with int ids: dense `[B]` or
        `[B, N]`, `tf.SparseTensor` or `tf.RaggedTensor` `[B, None]`.
      weights: None, or the same structure with float weights for sparse or
        ragged features (None leaves allowed; when `feature_config` is a
        dict, missing keys mean no weights).
      training: must be False: this backend cannot train.

    Returns:
      The structure of `feature_config`: `[B, D]` per feature, `[B, L, D]`
      per sequence feature, `output_shape + [D]` when set.

    Raises:
      NotImplementedError: `training=True`.
      ValueError: weights given for dense ids or a sequence feature; a
        structure that does not match `feature_config`.
    """
    if training:
      raise NotImplementedError(
        "the 'serving' backend is lookup-only: call lookup(training=False), "
        "or train with 'tensorcore' / 'tpu_embedding'."
      )
    self._maybe_build()
    if (
      weights is not None
      and isinstance(weights, collections.abc.Mapping)
      and isinstance(self._feature_config, collections.abc.Mapping)
    ):
      unknown = sorted(set(weights) - set(self._feature_config))
      if unknown:
        raise ValueError(
          f"weights name unknown features {unknown}; features "
          f"are {sorted(self._feature_config)}."
        )
      weights = {k: weights.get(k) for k in self._feature_config}
    # Flattening checks the structures against feature_config (naming missing
    # and extra features); repacking makes the output structure the config's.
    flat = self._flatten_like_config(features, "features")
    flat_w = (
      self._flatten_like_config(weights, "weights")
      if weights is not None
      else [None] * len(flat)
    )
    features, weights = self._pack_inputs(flat, flat_w)
    return serving_lookup(
      features, weights, self.embedding_tables, self._feature_config
    )

  @classmethod
  def from_backend(cls, backend: base.EmbeddingBackend) -> "ServingEmbedding":
    """A built, slot-free serving copy of another backend's current tables.

    For exporting what was trained in this process: the copy has the
    backend's feature structure, table names and settings (combiners,
    sequence lengths, output shapes) but no optimizer, and its tables hold
    the values of `backend.embedding_tables` (replicated, mirrored or
    sharded variables are all read as one `[vocab, dim]` value).

    Args:
      backend: a built backend that runs here (any but the TPU ones).

    Returns:
      The built `ServingEmbedding`, under the current strategy: `backend`
      itself when it is one, built and slot-free (`recsys export`'s: a
      copy would hold every table twice).
    """
    if (
      isinstance(backend, cls)
      and backend._built
      and not any(backend.slot_variables().values())
    ):
      return backend
    config, copies = mid_level.tf_feature_config(backend)
    for table in copies.values():
      table.optimizer = None  # lookup-only: no slot variables
    emb = cls(config)
    emb.build()
    trained = {
      backend.table_name(t): v for t, v in backend.embedding_tables.items()
    }
    for table, variable in emb.embedding_tables.items():
      variable.assign(tf.convert_to_tensor(trained[emb.table_name(table)]))
    return emb


@tf.autograph.experimental.do_not_convert
def serving_lookup(
  features: Any, weights: Any | None, tables: Any, feature_config: Any
) -> Any:
  """TF's `serving_embedding_lookup`, with the project's output shapes.

  The one CPU/GPU lookup of trained tables in this project. Arguments are
  those of `tf.tpu.experimental.embedding.serving_embedding_lookup`: the
  features may be any subset of `feature_config` (matched by path), and
  `tables` may be any backend's `embedding_tables`, read in place.

  Args:
    features: a nested structure of int ids whose paths are paths of
      `feature_config`: dense `[B]` or `[B, N]`, `tf.SparseTensor` or
      `tf.RaggedTensor` `[B, None]`.
    weights: None, or the structure of `features` with float weights for
      sparse or ragged ids (None leaves allowed).
    tables: `TableConfig` -> table variable `[vocab, dim]`, keyed by the
      `TableConfig` objects of `feature_config`, for every table looked up.
    feature_config: a nested structure of `FeatureConfig`.

  Returns:
    The structure of `features`: `[B, D]` per feature (a dense `[B, N]` bag
    combined with its table's combiner), `[B, L, D]` per sequence feature,
    `output_shape + [D]` when set.

  Raises:
    ValueError: a feature that is not in `feature_config`; weights given for
      dense ids; dense ids of rank > 2.

  Example:
    >>> acts = serving_lookup({"user": ids}, None, backend.embedding_tables,
    ...                       backend.feature_config)   # {"user": [B, D]}
  """
  flat = _tf_internal.flatten_with_joined_string_paths(features)
  flat_w = [None] * len(flat)
  if weights is not None:
    tf.nest.assert_same_structure(features, weights)
    flat_w = tf.nest.flatten(weights)
  by_path = dict(_tf_internal.flatten_with_joined_string_paths(feature_config))
  unknown = sorted(path for path, _ in flat if path not in by_path)
  if unknown:
    raise ValueError(
      f"features {unknown} are not in feature_config; its "
      f"features are {sorted(by_path)}."
    )
  ids, wts = [], []
  for (path, inp), w in zip(flat, flat_w):
    inp, w = _as_bag(path, by_path[path], inp, w)
    ids.append(inp)
    wts.append(w)
  packed_w = None
  if any(w is not None for w in wts):
    packed_w = tf.nest.pack_sequence_as(features, wts)
  ids, tables = _quantized_rows(ids, [by_path[p] for p, _ in flat], tables)
  outputs = tf.nest.flatten(
    embedding.serving_embedding_lookup(
      tf.nest.pack_sequence_as(features, ids), packed_w, tables, feature_config
    )
  )
  for i, (path, _) in enumerate(flat):
    feature = by_path[path]
    if feature.output_shape and feature.output_shape.rank:
      outputs[i] = tf.reshape(
        outputs[i], feature.output_shape.as_list() + [feature.table.dim]
      )
  return tf.nest.pack_sequence_as(features, outputs)


@tf.autograph.experimental.do_not_convert
def _quantized_rows(
  ids: list[Any], features: list[Any], tables: Any
) -> tuple[list[Any], Any]:
  """The lookup of quantized tables as the training backends do it.

  A table with a `quantization_config` is looked up through its rows that
  these ids read, gathered once and quantized (`backends.quantization`):
  TF's combine then runs on that small table with the ids renumbered into
  it, so serving equals training's lookup at the cost of the rows read,
  not of the table.
  """
  quantized = {
    id(f.table): f.table for f in features if f.table.quantization_config
  }
  if not quantized:
    return ids, tables
  ids, tables = list(ids), dict(tables)
  for table in quantized.values():
    mine = [i for i, f in enumerate(features) if f.table is table]
    values = [_id_values(ids[i]) for i in mine]
    unique, index = tf.unique(tf.concat(values, 0), out_idx=tf.int64)
    parts = tf.split(index, [tf.size(v) for v in values])
    for i, part in zip(mine, parts):
      ids[i] = _with_id_values(ids[i], part)
    rows = tf.gather(tables[table], unique)
    tables[table] = quantization.simulate(rows, table.quantization_config)
  return ids, tables


def _id_values(ids: Any) -> tf.Tensor:
  """The int64 ids of a dense, sparse or ragged feature, flat."""
  if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
    return tf.cast(ids.values, tf.int64)
  return tf.reshape(tf.cast(ids, tf.int64), [-1])


def _with_id_values(ids: Any, values: tf.Tensor) -> Any:
  """`ids` with its id values replaced (same structure and shape)."""
  if isinstance(ids, tf.SparseTensor):
    return tf.SparseTensor(ids.indices, values, ids.dense_shape)
  if isinstance(ids, tf.RaggedTensor):
    return ids.with_flat_values(values)
  return tf.reshape(values, tf.shape(ids))


@tf.autograph.experimental.do_not_convert
def _as_bag(path: str, feature: Any, ids: Any, weights: Any) -> tuple[Any, Any]:
  """Dense `[B, N]` ids -> a ragged bag of N ids per row (TF combines bags)."""
  if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
    return ids, weights
  ids = tf.convert_to_tensor(ids)
  if weights is not None:
    raise ValueError(
      f"feature {path!r}: weights were given but the ids are a dense tensor "
      f"of shape {ids.shape}; weights apply to SparseTensor or RaggedTensor "
      "bags only (the 'tensorcore' backend has the same rule)."
    )
  if ids.shape.rank == 1 and not feature.max_sequence_length:
    return ids, None  # TF's [B] -> [B, D] already follows the convention.
  if ids.shape.rank == 1:
    ids = ids[:, tf.newaxis]
  if ids.shape.rank != 2:
    raise ValueError(
      f"feature {path!r} got dense ids of shape {ids.shape}; expected [B] "
      "(one id per example) or [B, N] (bags of N ids)."
    )
  return tf.RaggedTensor.from_tensor(ids), None


# -- export --------------------------------------------------------------------


def _default_split(features: Any) -> tuple[Any, Any]:
  return features, None


class _ServingModule(tf.Module):
  """What the SavedModel holds: the embedding, the model and `serve`."""

  def __init__(
    self,
    emb: ServingEmbedding,
    model: Any,
    split_fn: Callable[[Any], tuple[Any, Any]],
    input_signature: Any,
  ):
    super().__init__(name="recsys_serving")
    self.embedding = emb
    self.model = model
    self._split_fn = split_fn

    def serve(features):
      ids, weights = self._split_fn(features)
      activations = self.embedding.lookup(ids, weights, training=False)
      return self.model(activations, features)

    self.serve = tf.function(serve, input_signature=[input_signature])


def export_saved_model(
  export_dir: str,
  emb: ServingEmbedding,
  model: Any,
  input_signature: Any,
  split_fn: Callable[[Any], tuple[Any, Any]] = _default_split,
) -> str:
  """Writes `model` on top of `emb` as a SavedModel that serves on CPU.

  The SavedModel has a `serve(features)` function (`tf.saved_model.load(dir)
  .serve(features)`) computing `model(emb.lookup(ids, weights), features)`
  with `(ids, weights) = split_fn(features)`; when every input is a dense
  `tf.TensorSpec` it is also the `serving_default` signature, taking the
  features as flat keyword arguments named by their paths (`/` -> `__`).

  Args:
    export_dir: directory to write.
    emb: a built (or restorable) `ServingEmbedding`, e.g. restored from a
      training checkpoint with `backends.checkpoint.restore`.
    model: callable `model(activations, features) -> scores`, trackable (a
      Keras model or `tf.Module`) so its variables are saved.
    input_signature: nested `tf.TensorSpec` / `tf.RaggedTensorSpec` /
      `tf.SparseTensorSpec` of `features`.
    split_fn: `features -> (ids, weights)` for the embedding lookup, e.g.
      `lambda f: (f["categorical"], f.get("weights"))`.

  Returns:
    `export_dir`.
  """
  emb.build()
  module = _ServingModule(emb, model, split_fn, input_signature)
  signatures = None
  leaves = _tf_internal.flatten_with_joined_string_paths(input_signature)
  if all(type(spec) is tf.TensorSpec for _, spec in leaves):  # pylint: disable=unidiomatic-typecheck
    names = [path.replace("/", "__") for path, _ in leaves]
    specs = [
      tf.TensorSpec(spec.shape, spec.dtype, name=n)
      for n, (_, spec) in zip(names, leaves)
    ]

    def flat_serve(**kwargs):
      features = tf.nest.pack_sequence_as(
        input_signature, [kwargs[n] for n in names]
      )
      scores = module.serve(features)
      return scores if isinstance(scores, dict) else {"scores": scores}

    signatures = {
      "serving_default": tf.function(flat_serve).get_concrete_function(
        **{n: s for n, s in zip(names, specs)}
      )
    }
  tf.saved_model.save(module, export_dir, signatures=signatures)
  return export_dir
