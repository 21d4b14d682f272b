"""The checks every lookup engine runs on a feature's input, in one place.

Both engines of the backends that own their tables — the flat bags of
`backends.inputs` (TF ops and fused kernels) and the static-shape bags of
`backends.static_bags` (compiled steps) — refuse the same bad inputs with the
same messages: ids that are not integers, inputs of the wrong kind or rank,
weights misplaced or of the wrong kind, malformed sparse or ragged bags. Each
message names the feature, its table and vocabulary (`describe`) and says
what was expected.

Checks that need the values run as graph assertions inside a traced step and
raise `InvalidInputError` eagerly (`require`, `check`). An engine gathers the
value checks of all its features into one assertion (`CheckGroup`): one
`tf.cond` (two branch graphs to trace) per lookup instead of one per check.

Example:
  >>> layout = FeatureLayout("user", feature_config["user"], "users")
  >>> check_weights(layout, ids, weights)      # raises InvalidInputError
  >>> check_id_dtype(layout, ids.values)
"""

import collections
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from backends.errors import BackendError

#: What a lookup does with an id outside `[0, vocabulary_size)`.
ID_POLICIES = ("error", "drop", "oov")

#: Static-shape bags padded on the host (`backends.inputs.pad_bags`): ids
#: `[B, W]`, lengths `[B]` (entries at positions >= length are padding) and
#: weights `[B, W]`, or `[B, 0]` when the bags have no weights (every weight
#: 1).
PaddedBags = collections.namedtuple("PaddedBags", ["ids", "lengths", "weights"])


class InvalidInputError(BackendError, ValueError):
  """A feature's input has the wrong type, rank, dtype or weights."""


@dataclasses.dataclass(frozen=True)
class FeatureLayout:
  """One feature: its path, config and table name; how its output is shaped.

  Attributes:
    path: the feature's path in `feature_config` (named in every error).
    feature: its `FeatureConfig`.
    table_name: its table's name.
  """

  path: str
  feature: Any  # FeatureConfig
  table_name: str

  @property
  def sequence_length(self) -> int:
    return self.feature.max_sequence_length

  def output_shape(self, batch_size: int | None) -> list | None:
    """The `output_shape` of the config resolved against the batch size."""
    del batch_size
    shape = self.feature.output_shape
    if not shape or shape.rank is None or shape.rank == 0:
      return None
    return shape.as_list()


def describe(layout: FeatureLayout) -> str:
  """Names a feature, its table and vocabulary for error messages."""
  table = layout.feature.table
  return (
    f"feature {layout.path!r} (table {layout.table_name!r}, "
    f"vocabulary_size={table.vocabulary_size})"
  )


def template_safe(text: str) -> str:
  """`text` with braces doubled, to sit in a `str.format` template."""
  return text.replace("{", "{{").replace("}", "}}")


# -- types, kinds and ranks -------------------------------------------------


def check_id_dtype(layout: FeatureLayout, ids: tf.Tensor) -> None:
  """Ids must be integers (strings are hashed or looked up in the pipeline)."""
  if not ids.dtype.is_integer:
    raise InvalidInputError(
      f"{describe(layout)} got ids of dtype {ids.dtype.name}; expected "
      "int32 or int64 row ids (hash or look up strings in the input pipeline)."
    )


def check_sparse_ids(layout: FeatureLayout, inp: tf.SparseTensor) -> None:
  """A `SparseTensor` of ids: integer values, rank 2 `[batch, ids]`."""
  check_id_dtype(layout, inp.values)
  if inp.shape.rank not in (None, 2):
    raise InvalidInputError(
      f"{describe(layout)} got a SparseTensor of rank {inp.shape.rank}; "
      "expected rank 2 [batch, ids]."
    )


def check_ragged_ids(layout: FeatureLayout, inp: tf.RaggedTensor) -> None:
  """A `RaggedTensor` of ids: integer values, rank 2 `[batch, (ids)]`."""
  check_id_dtype(layout, inp.flat_values)
  if inp.ragged_rank != 1 or inp.shape.rank != 2:
    raise InvalidInputError(
      f"{describe(layout)} got a RaggedTensor of rank {inp.shape.rank} "
      f"(ragged_rank {inp.ragged_rank}); expected rank 2 [batch, (ids)]."
    )


def dense_ids(layout: FeatureLayout, inp: Any) -> tf.Tensor:
  """Dense ids as `[B, N]` (`[B]` becomes `[B, 1]`), checked.

  Raises:
    InvalidInputError: not integers, or a rank other than 1 or 2.
  """
  inp = tf.convert_to_tensor(inp)
  check_id_dtype(layout, inp)
  if inp.shape.rank == 1:
    return inp[:, tf.newaxis]
  if inp.shape.rank != 2:
    raise InvalidInputError(
      f"{describe(layout)} got dense ids of shape {inp.shape}; expected "
      "[B] (one id per example) or [B, N] (bags of N ids)."
    )
  return inp


def unsupported_kind(layout: FeatureLayout, inp: Any) -> InvalidInputError:
  """The error for ids that are no tensor kind a lookup takes."""
  return InvalidInputError(
    f"{describe(layout)} got a {type(inp).__name__}; expected a tf.Tensor, "
    "tf.SparseTensor or tf.RaggedTensor of int ids."
  )


def check_weights(layout: FeatureLayout, inp: Any, weights: Any) -> None:
  """Weights, if any, are float and of the ids' kind (sparse or ragged)."""
  if weights is None:
    return
  if isinstance(inp, PaddedBags):
    raise InvalidInputError(
      f"{describe(layout)}: the ids are PaddedBags, which carry their own "
      "weights; pass weights=None for this feature."
    )
  if isinstance(inp, tf.Tensor):
    raise InvalidInputError(
      f"{describe(layout)}: weights were given but the ids are a dense "
      "tensor; weights apply to SparseTensor or RaggedTensor bags only."
    )
  if type(weights) is not type(inp):  # pylint: disable=unidiomatic-typecheck
    raise InvalidInputError(
      f"{describe(layout)}: weights are a {type(weights).__name__} but the "
      f"ids are a {type(inp).__name__}; they must be the same kind."
    )
  if layout.sequence_length > 0:
    raise InvalidInputError(
      f"{describe(layout)} is a sequence feature (max_sequence_length="
      f"{layout.sequence_length}); sequence features take no weights."
    )
  values = weights.values
  if not values.dtype.is_floating:
    raise InvalidInputError(
      f"{describe(layout)}: weights have dtype {values.dtype.name}; expected "
      "a floating-point dtype."
    )


def sequence_length_from_output_shape(
  layout: FeatureLayout, out_shape: list, batch_size: Any
) -> int:
  """TF's `output_shape` rule: prod == B combines; k * B is a sequence of k.

  Raises:
    InvalidInputError: the batch size is not static, or the product of
      `out_shape` is neither the batch size nor a multiple of it.
  """
  out_batch = 1
  for d in out_shape:
    out_batch *= d
  static_b = tf.get_static_value(batch_size)
  if static_b is None:
    raise InvalidInputError(
      f"{describe(layout)} sets output_shape={out_shape} but the batch size "
      "is not static; batch with drop_remainder=True."
    )
  static_b = int(static_b)
  if out_batch == static_b:
    return 0
  if out_batch > static_b and out_batch % static_b == 0:
    return out_batch // static_b
  raise InvalidInputError(
    f"{describe(layout)}: output_shape={out_shape} (product {out_batch}) must "
    f"equal the batch size {static_b} or be a multiple of it."
  )


# -- value checks (eager: raise; traced: fail the step) ----------------------


def require(ok: Any, message: str) -> list:
  """Raises `InvalidInputError` (eager) or fails the step (graph) unless ok.

  Returns the graph-mode assertion (to run before ops that would fail on
  the same input with a message of their own), or nothing eagerly.
  """
  if tf.executing_eagerly():
    if not bool(tf.reduce_all(ok)):
      raise InvalidInputError(message)
    return []
  return [tf.debugging.Assert(tf.reduce_all(ok), [message.replace("'", "`")])]


def check(ok: tf.Tensor, template: str, args_fn: Callable[[], list]) -> list:
  """Raises `InvalidInputError` (eager) or fails the step (graph) unless ok.

  `template` has one `{}` per tensor that `args_fn()` returns; they are only
  computed when the check fails, so a passing check costs one reduction.
  Returns the ops (graph mode) that must run before the lookup.
  """
  if tf.executing_eagerly():
    if not bool(ok):
      raise InvalidInputError(template.format(*(a.numpy() for a in args_fn())))
    return []
  group = getattr(_active, "group", None)
  if group is not None:
    group.pending.append((ok, template, args_fn))
    return []
  return _assertion([(ok, template, args_fn)])


def _assertion(pending: list) -> list:
  """One graph assertion for `(ok, template, args_fn)` checks: it fails with
  the message of the first check that does not hold."""
  oks = [tf.reshape(ok, []) for ok, _, _ in pending]

  def fail():
    # The graph-mode assertion message C-escapes quotes (\\'): use backticks.
    messages = [
      tf.strings.format(template.replace("'", "`"), args_fn())
      for _, template, args_fn in pending
    ]
    message = messages[0]
    if len(messages) > 1:
      first = tf.argmin(tf.cast(tf.stack(oks), tf.int32))
      message = tf.gather(tf.stack(messages), first)
    with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
      return tf.constant(False)

  ok = oks[0] if len(oks) == 1 else tf.reduce_all(tf.stack(oks))
  return [tf.cond(ok, lambda: tf.constant(True), fail)]


# Per thread: a MirroredStrategy traces each replica's step in a thread.
_active = threading.local()


class CheckGroup:
  """Collects the graph-mode `check`s made inside `with group:` (this thread).

  `assertion()` then builds them as one assertion, to run before anything
  reads the checked tensors; eagerly, `check` raises at once as always.

  Example:
    >>> group = CheckGroup()
    >>> with group:
    ...   bags = [validate(layout, bag, "error")[0] for ...]
    >>> deps = group.assertion()  # control dependencies of the lookups
  """

  def __init__(self):
    self.pending: list = []

  def __enter__(self) -> "CheckGroup":
    self._outer = getattr(_active, "group", None)
    _active.group = self
    return self

  def __exit__(self, *exc) -> None:
    _active.group = self._outer

  def assertion(self) -> list:
    """The ops (graph mode) that fail the step unless every check holds."""
    pending, self.pending = self.pending, []
    return _assertion(pending) if pending else []


def first_where(mask: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
  """`values` at the first True of `mask`; safe on empty tensors."""
  first = tf.argmax(tf.concat([tf.cast(mask, tf.int32), [1]], 0))
  return tf.gather(tf.concat([values, tf.zeros([1], values.dtype)], 0), first)


def _same_vector(
  a: tf.Tensor, b: tf.Tensor, counts_differ: tf.Tensor
) -> tf.Tensor:
  """Whether two 1-D int tensors are equal; True when `counts_differ` (the
  values-count check reports that case with its own message)."""
  same_shape = tf.reduce_all(tf.equal(tf.shape(a), tf.shape(b)))
  return tf.logical_or(
    counts_differ,
    tf.cond(
      same_shape,
      lambda: tf.reduce_all(tf.equal(a, tf.cast(b, a.dtype))),
      lambda: tf.constant(False),
    ),
  )


def check_bag_structure(what: str, inp: Any, weights: Any) -> list:
  """Checks that sparse/ragged bags are well formed and weights sit on the ids.

  Weights are paired with ids by position: ragged weights must have the ids'
  row lengths and sparse weights the ids' indices, or each weight would land
  on another id. A SparseTensor's rows must lie in `[0, dense_shape[0])`.

  Args:
    what: names the feature in the message.
    inp: ids (`SparseTensor` or `RaggedTensor`; other kinds are not checked).
    weights: None or weights of the same kind.

  Returns:
    The graph-mode checks, for control dependencies (empty eagerly).

  Raises:
    InvalidInputError: (eager; a failed step in graph mode) on a mismatch.
  """
  checks = []
  if isinstance(inp, tf.SparseTensor):
    rows = inp.indices[:, 0]
    checks += require(
      tf.logical_and(
        tf.reduce_all(rows >= 0), tf.reduce_all(rows < inp.dense_shape[0])
      ),
      f"{what}: a SparseTensor index has a row outside [0, "
      "dense_shape[0]); indices must lie inside dense_shape.",
    )
    if inp.indices.shape.rank == 2 and inp.indices.shape[1] == 2:
      # A negative column would be read as a position before the row's first
      # (a sequence's id landing in the previous row's last slot).
      cols = inp.indices[:, 1]
      checks += require(
        tf.reduce_all(cols >= 0),
        f"{what}: a SparseTensor index has a negative column; indices "
        "must lie inside dense_shape (columns >= 0).",
      )
    if isinstance(weights, tf.SparseTensor):
      checks += require(
        _same_vector(
          tf.reshape(weights.indices, [-1]),
          tf.reshape(inp.indices, [-1]),
          tf.size(weights.values) != tf.size(inp.values),
        ),
        f"{what}: weights sit at other indices than the ids; sparse "
        "weights must have exactly the ids' indices.",
      )
  elif isinstance(inp, tf.RaggedTensor) and isinstance(
    weights, tf.RaggedTensor
  ):
    checks += require(
      _same_vector(
        weights.row_splits,
        inp.row_splits,
        tf.size(weights.flat_values) != tf.size(inp.flat_values),
      ),
      f"{what}: weights have other row lengths than the ids; ragged "
      "weights must have exactly the ids' row lengths.",
    )
  return checks


def check_ids_in_range(
  layout: FeatureLayout, ok: tf.Tensor, example: Callable[[], list]
) -> list:
  """Fails on an id outside `[0, vocabulary_size)`, naming id and batch row.

  Args:
    layout: the feature.
    ok: bool scalar, False when some id is out of range.
    example: returns `[an offending id, its batch row]` (only run on failure).
  """
  vocab = layout.feature.table.vocabulary_size
  return check(
    ok,
    template_safe(describe(layout))
    + f" got id {{}} at batch row {{}}; ids must be in [0, {vocab}).",
    example,
  )
