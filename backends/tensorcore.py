"""The TensorCore backend: replicated tables, lookups on the compute devices.

This is the design of TF's `TPUEmbeddingV0` (the path for TPUs without an
embedding accelerator), implemented so that it runs under any strategy —
default, `MirroredStrategy`, `MultiWorkerMirroredStrategy`, `TPUStrategy` —
and improved where V0 falls short:

* The embedding optimizer is applied here, as sparse row updates with the TPU
  optimizers' math (`backends.optimizers`), after summing each touched row's
  gradient over the global batch.
* Replicas exchange only the rows they touched, never a dense all-reduce of
  whole tables.
* Ids are de-duplicated per table before the gather (features sharing a
  table share one gather).
* Inputs are validated: ids outside `[0, vocabulary_size)` raise an error
  naming the feature, table, id and batch row (or are dropped / mapped to an
  OOV row, and counted).
* `preprocess` pads sparse and ragged bags to a static width on the host.
* On CPU hosts a training step runs fused C++ kernels (`backends.kernels`)
  instead of a chain of generic TF ops; same math.
* Compiled steps (a TPU, `jit_compile=True`) take a static-shape engine
  (`backends.engines.static`): fixed-capacity de-duplication, padding slots
  that never touch a row, a fixed-size exchange; same math again.

The machinery is `backends.composed` (a storage per table x an engine per
step). It keeps V0's public API (`embedding_lookup`, `__call__`,
`embedding_tables`, slots through `slot_variable_creation_fn`, building on
first use), so V0's own training-loop example (a tape on `embedding_tables`
and a Keras optimizer, in a `tf.range` loop) runs as written on replicated
tables, with several mirrored replicas and compiled.

Example:
  >>> table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="items")
  >>> config = {"item": tf.tpu.experimental.embedding.FeatureConfig(table)}
  >>> opt = tf.tpu.experimental.embedding.Adagrad(0.1)
  >>> emb = TensorCoreEmbedding(config, opt)
  >>> with tf.GradientTape() as tape:
  ...   acts = emb({"item": tf.constant([3, 5])}, training=True)
  ...   loss = tf.reduce_sum(acts["item"])
  >>> emb.apply_gradients(tape.gradient(loss, acts))
"""

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from backends import base, composed
from backends.storage import TableStorage
from backends.storage import replicated as replicated_lib


class TensorCoreEmbedding(composed.ComposedEmbedding):
  """Replicated embedding tables trained with TPU optimizer semantics anywhere.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: defaults to the strategy in scope.
    bag_widths, invalid_ids, fused_kernels, static_shapes: see
      `backends.composed.ComposedEmbedding`.
  """

  name = "tensorcore"
  capabilities = base.Capabilities()
  options = frozenset(
    {
      "bag_widths",
      "invalid_ids",
      "fused_kernels",
      "static_shapes",
    }
  )

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    bag_widths: None | int | Mapping[str, int] = None,
    invalid_ids: str = "error",
    fused_kernels: bool = True,
    static_shapes: bool | None = None,
  ):
    super().__init__(
      feature_config,
      optimizer,
      strategy,
      bag_widths=bag_widths,
      invalid_ids=invalid_ids,
      fused_kernels=fused_kernels,
      static_shapes=static_shapes,
    )

  def _make_storage(self, table: Any) -> TableStorage:
    return replicated_lib.Replicated(
      table, self.table_name(table), self.optimizer_for(table), self._strategy
    )
