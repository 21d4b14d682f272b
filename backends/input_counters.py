"""Per-feature counts of the ids a lookup refused, dropped or cut.

Lookups count, per feature and per replica (not checkpointed): ids that the
"drop" / "oov" policies dropped or mapped (`invalid`), ids cut because a bag
or sequence was longer than its static width (`truncated`), and — because a
compiled step cannot raise — the ids and weights a compiled step left out
under the "error" policy, with one example id and its batch row
(`refused_*`), which `raise_for_refused` turns into the uncompiled path's
error after the step.

Example:
  >>> counters = InputCounters(["user", "items"])     # under strategy.scope()
  >>> counters.truncated["items"].assign_add(bags.truncated)   # in a step
  >>> counters.raise_for_refused(layouts, strategy)            # after steps
"""

from collections.abc import Sequence

import tensorflow as tf

from backends import input_checks as checks_lib


def _per_replica(name: str, value) -> tf.Variable:
  return tf.Variable(
    value,
    dtype=tf.int64,
    trainable=False,
    name=name,
    synchronization=tf.VariableSynchronization.ON_READ,
    aggregation=tf.VariableAggregation.SUM,
  )


class InputCounters:
  """Per-feature input counters (per-replica sums; not checkpointed).

  Args:
    paths: the features' paths.
  """

  def __init__(self, paths: Sequence[str]):
    def counter(kind, path):
      return _per_replica(f"{kind}_{path.replace('/', '_')}", 0)

    self.invalid = {p: counter("invalid_ids", p) for p in paths}
    self.truncated = {p: counter("truncated_ids", p) for p in paths}
    self.refused_ids = {p: counter("refused_ids", p) for p in paths}
    self.refused_weights = {p: counter("refused_weights", p) for p in paths}
    self.refused_example = {
      p: _per_replica(
        f"refused_example_{p.replace('/', '_')}", tf.zeros([2], tf.int64)
      )
      for p in paths
    }

  def stats(self) -> dict[str, dict[str, int]]:
    """Invalid (dropped / mapped) and truncated ids per feature."""
    return {
      "invalid_ids": {p: int(v.numpy()) for p, v in self.invalid.items()},
      "truncated_ids": {p: int(v.numpy()) for p, v in self.truncated.items()},
    }

  def raise_for_refused(
    self,
    layouts: Sequence[checks_lib.FeatureLayout],
    strategy: tf.distribute.Strategy,
  ) -> None:
    """Raises if a compiled step refused ids or weights; resets the counts.

    Raises:
      InvalidInputError: naming the feature, table, an id and its batch row.
    """
    for layout in layouts:
      path = layout.path
      bad_ids = int(self.refused_ids[path].numpy())
      bad_weights = int(self.refused_weights[path].numpy())
      if not bad_ids and not bad_weights:
        continue
      examples = [
        v.numpy()
        for v in strategy.experimental_local_results(self.refused_example[path])
      ]
      example = next((e for e in examples if e.any()), examples[0])
      for var in (
        self.refused_ids[path],
        self.refused_weights[path],
        self.refused_example[path],
      ):
        for local in strategy.experimental_local_results(var):
          local.assign(tf.zeros_like(local))
      what = checks_lib.describe(layout)
      if bad_ids:
        raise checks_lib.InvalidInputError(
          f"{what} got id {example[0]} at batch row {example[1]} in a "
          f"compiled step ({bad_ids} such ids); ids must be in [0, "
          f"{layout.feature.table.vocabulary_size}). The step left them "
          "out; nothing was saved after it."
        )
      raise checks_lib.InvalidInputError(
        f"{what} got {bad_weights} weights that are NaN, infinite or "
        "negative in a compiled step; weights must be finite and >= 0. The "
        "step left those ids out; nothing was saved after it."
      )
