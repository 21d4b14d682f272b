"""Checks at the entrance of the exported signatures: shapes, then ids.

A SavedModel's signature does not check the shapes of what a client sends:
a `[B]` input fed `[B, 1]`, or `user_id` and `item_id` of different
lengths, failed deep inside the graph (`allocate_output with bad index`,
`indices[30] = 1 is not in [0, 1)`), and an id beyond a table's vocabulary
failed in a gather that named no feature. Here every signature first checks
its inputs and fails with an `InvalidArgumentError` that names the inputs,
their shapes and what was expected, or the feature, row and id.

The expected shape of an input is its placeholder's (the signature's
`TensorSpec`): `[B]`, `[B, W]`, `[B, num_dense]`. Grappler folds a
placeholder's rank into a constant, so the rank is read at run time from
`tf.where` over the shape, which it cannot fold.

Example (inside a signature):
  >>> inputs = checked_shapes(inputs)
  >>> inputs = checked_ids(inputs, specs, names)
"""

from collections.abc import Mapping, Sequence

from recsys._keras import tf
from recsys.feature_spec import FeatureSpec

_MAX_RANK = 4  # shapes are padded to this many dims for the comparison


def _runtime_shape(value: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(rank, shape padded with -1 to `_MAX_RANK` dims), read at run time."""
  shape = tf.shape(value, out_type=tf.int64)
  rank = tf.shape(tf.where(shape >= 0), out_type=tf.int64)[0]
  padded = tf.concat(
    [shape, tf.fill([_MAX_RANK], tf.constant(-1, tf.int64))], 0
  )
  return rank, padded[:_MAX_RANK]


def _shape_text(rank: tf.Tensor, padded: tf.Tensor) -> tf.Tensor:
  """`[2, 3]`: the first `rank` dims of `padded`."""
  dims = tf.strings.as_string(padded[: tf.minimum(rank, _MAX_RANK)])
  return tf.strings.join(
    ["[", tf.strings.reduce_join(dims, separator=", "), "]"]
  )


def _expected_text(shape: tf.TensorShape) -> str:
  dims = ["B" if d is None and i == 0 else str(d) for i, d in enumerate(shape)]
  return "[" + ", ".join(dims) + "]"


def _after(checks: Sequence[tf.Operation], inputs: Mapping[str, tf.Tensor]):
  """`inputs`, each read only after `checks` ran."""
  with tf.control_dependencies(list(checks)):
    return {name: tf.identity(value) for name, value in inputs.items()}


def checked_shapes(inputs: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """`inputs` after asserting each has its placeholder's shape, one batch B.

  Raises (when run):
    InvalidArgumentError: an input of another rank or width, or inputs of
      different batch lengths; lists every input's shape and the expected.
  """
  names = sorted(inputs)
  if not names:
    return dict(inputs)
  ok = tf.constant(True)
  texts, batch = [], None
  for name in names:
    value = inputs[name]
    expected = value.shape
    rank, padded = _runtime_shape(value)
    ok = tf.logical_and(ok, tf.equal(rank, expected.rank))
    for i, dim in enumerate(expected):
      if dim is not None and i:
        ok = tf.logical_and(ok, tf.equal(padded[i], dim))
    if expected.rank:
      batch = padded[0] if batch is None else batch
      ok = tf.logical_and(ok, tf.equal(padded[0], batch))
    texts.append((name, rank, padded, _expected_text(expected)))

  def message():
    got = [
      piece
      for name, rank, padded, _ in texts
      for piece in (
        f", {name} " if name != names[0] else f"{name} ",
        _shape_text(rank, padded),
      )
    ]
    want = ", ".join(f"{name} {e}" for name, _, _, e in texts)
    # No quotes: TF escapes them in an assertion's message.
    return tf.strings.join(
      [
        "serving inputs of shapes ",
        *got,
        "; expected ",
        want,
        ", one batch size B for every input.",
      ]
    )

  text = tf.cond(ok, lambda: tf.constant(""), message)
  return _after([tf.debugging.Assert(ok, [text])], inputs)


def checked_ids(
  inputs: Mapping[str, tf.Tensor],
  specs: Sequence[FeatureSpec],
  names: Sequence[str],
) -> dict[str, tf.Tensor]:
  """`inputs` after asserting the ids of `names` are in their vocabulary.

  Ids must be in `[0, vocabulary_size)`; padded `[B, W]` ids may also be
  -1 (padding). Raw ids (`FeatureSpec.raw_ids`) may be any int64 (-1
  still pads a `[B, W]` row): the export maps them to rows.

  Raises (when run):
    InvalidArgumentError: names the feature, its table and vocabulary
      size, the first bad id and its row.
  """
  by_name = {s.name: s for s in specs}
  checks = []
  for name in names:
    ids, spec = inputs[name], by_name[name]
    if getattr(spec, "raw_ids", False):
      continue  # any int64: the export's id map gives it a row or default
    size = int(spec.vocabulary_size)
    padded = ids.shape.rank is not None and ids.shape.rank > 1
    low = -1 if padded else 0
    flat = tf.reshape(ids, [-1])
    bad = tf.logical_or(flat < low, flat >= size)
    if padded:
      bad = tf.logical_and(bad, tf.not_equal(flat, -1))
    table = spec.table or spec.name
    width = tf.cast(tf.size(ids) // tf.maximum(tf.shape(ids)[0], 1), tf.int64)

    def message(
      flat=flat,
      bad=bad,
      width=width,
      name=name,
      table=table,
      size=size,
      padded=padded,
    ):
      index = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
      return tf.strings.join(
        [
          f"feature {name} (table {table}, vocabulary_size={size}) got id ",
          tf.strings.as_string(flat[index]),
          " at batch row ",
          tf.strings.as_string(index // tf.maximum(width, 1)),
          f"; ids must be in [0, {size})",
          " (-1 pads a row)." if padded else ".",
        ]
      )

    any_bad = tf.reduce_any(bad)
    text = tf.cond(any_bad, message, lambda: tf.constant(""))
    checks.append(tf.debugging.Assert(tf.logical_not(any_bad), [text]))
  return _after(checks, inputs)


__all__ = ["checked_ids", "checked_shapes"]
