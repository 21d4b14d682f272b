"""A CPU step's dense part on slices of the batch, run side by side.

On CPU the recsys thread settings give each op one core and run two ops at a
time (`recsys.process.threads`). A ranking model's dense part — MLPs, the
feature interaction and their gradients — is a chain of matmuls, each
waiting for the last, so it keeps one core busy while the other idles. Cut
the batch into k slices and the model's forward and backward passes over the
slices are independent chains until their weight gradients are added: TF's
inter-op threads run them side by side. The step's gradients are the same
sums added in another order (float32 rounding apart) and the metrics get the
same updates, slice by slice; the embedding lookup and update still see the
whole batch.

Only a model whose examples' losses do not depend on each other may be cut
(`EXAMPLES_INDEPENDENT`: the ranking models; not a retrieval model's
in-batch softmax or iALS's summed solves), built from layers known to
compute each example alone (`PER_EXAMPLE_LAYERS`; a user's layer class
says so with `EXAMPLES_INDEPENDENT = True`). Batch statistics (the
BatchNormalization family, SyncBatchNormalization included), activity
regularizers and `add_loss` (Keras keeps only the last call's) always keep
the batch whole; a layer the project cannot see into keeps it whole unless
its class declares itself per-example.

Measured on the default experiment's dense part (DLRM, AMD EPYC, 2 cores),
1 vs 2 slices: batch 1024 1.66 -> 1.07 ms (4 slices: 1.17), 512 0.98 ->
0.67, 256 0.61 -> 0.46, 128 0.46 -> 0.37, 64 0.35 -> 0.30. `None` (auto)
picks 2 where each slice keeps 128 examples, 1 elsewhere (`resolve`).
"""

from typing import Any, NamedTuple

from backends import hardware
from recsys._keras import keras, tf
from recsys.models.loss_inputs import LossInputs
from recsys.process import threads
from recsys.train_settings import TrainerConfigError

#: Slices `None` picks on a CPU replica with 2 or more cores (4 were slower
#: than 2 on 2 cores; the step's two inter-op threads run two chains).
AUTO_SLICES = 2
#: Examples a slice keeps at least, or auto stays at 1 slice: a margin (2
#: slices of 32 still gained 1.17x, of 512 1.55x).
MIN_SLICE_EXAMPLES = 128


class SlicePlan(NamedTuple):
  """How many slices a replica's dense part runs on, and why (for the log)."""

  slices: int
  reason: str


#: Layer classes (by module root and name) whose output for an example
#: depends on that example alone, or containers of such layers.
PER_EXAMPLE_LAYERS = frozenset(
  {
    ("tf_keras", name)
    for name in (
      "Activation",
      "Add",
      "Average",
      "Concatenate",
      "Dense",
      "Dot",
      "Embedding",
      "Flatten",
      "InputLayer",
      "LayerNormalization",
      "Maximum",
      "Minimum",
      "Multiply",
      "Reshape",
      "Sequential",
      "Subtract",
    )
  }
  | {
    ("tensorflow_recommenders", "Cross"),
    ("tensorflow_recommenders", "Ranking"),  # its metrics update per slice
    ("recsys", "DotInteraction"),
  }
)


def batch_coupled_layer(model: keras.Model) -> str | None:
  """The first layer of `model` that couples a batch's examples (batch
  statistics, an activity regularizer, `add_loss`), as `type: name`; None
  when none does."""
  for layer in model._flatten_layers(include_self=False):  # pylint: disable=protected-access
    kind = type(layer).__name__
    if any("BatchNormalization" in c.__name__ for c in type(layer).__mro__):
      return f"{kind}: {layer.name} (batch statistics)"
    if getattr(layer, "activity_regularizer", None) is not None:
      return f"{kind}: {layer.name} (activity_regularizer)"
    # What its calls added (add_loss), in a graph or eagerly.
    if getattr(layer, "_losses", None) or getattr(layer, "_eager_losses", None):
      return f"{kind}: {layer.name} (add_loss)"
  return None


def unknown_layer(model: keras.Model) -> str | None:
  """The first layer of `model` not known to compute each example alone
  (`PER_EXAMPLE_LAYERS`, or a class with `EXAMPLES_INDEPENDENT = True`),
  as `type: name`; None when there is none."""
  for layer in model._flatten_layers(include_self=False):  # pylint: disable=protected-access
    cls = type(layer)
    if getattr(cls, "EXAMPLES_INDEPENDENT", False):
      continue
    if (cls.__module__.split(".")[0], cls.__name__) not in PER_EXAMPLE_LAYERS:
      return f"{cls.__name__}: {layer.name}"
  return None


def _why_not(model: keras.Model, asked: bool) -> str | None:
  """Why `model`'s dense part cannot be cut into slices; None if it can.
  `asked`: the user set the slices, so a layer the project cannot see into
  is refused naming how to declare it, rather than left whole."""
  if not getattr(model, "EXAMPLES_INDEPENDENT", False):
    return (
      f"{type(model).__name__}'s examples share a loss "
      "(EXAMPLES_INDEPENDENT is false)"
    )
  coupled = batch_coupled_layer(model)
  if coupled:
    return (
      f"{type(model).__name__} has a layer that couples the batch ({coupled})"
    )
  unknown = unknown_layer(model)
  if unknown:
    declare = (
      "; if its output for an example depends on that example alone, set "
      "EXAMPLES_INDEPENDENT = True on its class"
      if asked
      else ""
    )
    return (
      f"{type(model).__name__} has a layer the project cannot see into "
      f"({unknown}){declare}"
    )
  return None


def resolve(
  setting: int | None,
  model: keras.Model,
  strategy: tf.distribute.Strategy,
  compiled: bool,
  global_batch_size: int,
  cores: int | None = None,
) -> SlicePlan:
  """The slices of each replica's dense part (`train.batch_slices`).

  Args:
    setting: an int >= 1 as set (checked by `train_settings.check`), or
      None: 2 on a CPU replica of 2 or more cores whose step is not
      XLA-compiled, for a model whose examples are independent, when each
      slice keeps `MIN_SLICE_EXAMPLES`; else 1.
    model: the run's model.
    strategy: the run's strategy.
    compiled: whether the replica step is XLA-compiled (a TPU's, or
      `train.jit_compile`): one program, nothing for slices to gain.
    global_batch_size: examples per step over all replicas.
    cores: CPU cores of this process (None: detected).

  Raises:
    TrainerConfigError: slices > 1 for a model whose examples cannot be
      cut apart (naming it and why).
  """
  local_batch = global_batch_size // max(1, strategy.num_replicas_in_sync)
  if setting is not None:  # its range: `train_settings.check_batch_slices`
    why_not = _why_not(model, asked=True) if setting > 1 else None
    if why_not:
      raise TrainerConfigError(
        f"train.batch_slices={setting}: {why_not}, so cutting the batch "
        "would change the loss; use 1 or None."
      )
    return SlicePlan(setting, "as set (train.batch_slices)")
  if compiled or hardware.is_tpu(strategy):
    return SlicePlan(1, "the step is XLA-compiled as one program")
  if hardware.is_parameter_server(strategy) or hardware.device_kinds(
    strategy
  ) != {"CPU"}:
    return SlicePlan(1, "the replicas are not local CPU devices")
  why_not = _why_not(model, asked=False)
  if why_not:
    return SlicePlan(1, why_not)
  local_replicas = max(1, len(hardware.worker_devices(strategy)))
  cores_each = (cores or threads.available_cores()) // local_replicas
  if cores_each < 2:
    return SlicePlan(1, f"{cores_each} CPU core(s) per replica")
  if local_batch < AUTO_SLICES * MIN_SLICE_EXAMPLES:
    return SlicePlan(
      1,
      f"{local_batch} examples per replica (< {AUTO_SLICES} x "
      f"{MIN_SLICE_EXAMPLES})",
    )
  return SlicePlan(
    AUTO_SLICES,
    f"{cores_each} CPU cores per replica run the slices' forward and "
    "backward passes side by side",
  )


@tf.autograph.experimental.do_not_convert
def bounds(batch: Any, slices: int) -> list[tuple[Any, Any]]:
  """`slices` contiguous row ranges covering `batch` rows (an int, or a
  scalar tensor when the batch size is not static), sizes differing by at
  most one."""
  edges = [batch * i // slices for i in range(slices + 1)]
  return list(zip(edges[:-1], edges[1:]))


@tf.autograph.experimental.do_not_convert
def _pieces(x: Any, ranges: list[tuple[int, int]]) -> list[Any]:
  """`x` (batch-major tensor, ragged or sparse tensor) cut into `ranges` of
  rows. A dense tensor is split in one op, whose gradient is one concat."""
  if x is None:
    return [None] * len(ranges)
  if isinstance(x, tf.SparseTensor):
    rest = x.dense_shape[1:]
    return [
      tf.sparse.slice(
        x,
        tf.concat([[begin], tf.zeros_like(rest)], 0),
        tf.concat([[end - begin], rest], 0),
      )
      for begin, end in ranges
    ]
  if isinstance(x, tf.RaggedTensor):
    return [x[begin:end] for begin, end in ranges]
  sizes = [end - begin for begin, end in ranges]
  if any(isinstance(size, tf.Tensor) for size in sizes):
    sizes = tf.stack(sizes)
  return tf.split(x, sizes, axis=0, num=len(ranges))


@tf.autograph.experimental.do_not_convert
def _cut(structure: Any, ranges: list[tuple[int, int]]) -> list[Any]:
  """`structure` (a nest of batch-major tensors) as one nest per range."""
  flat = [_pieces(x, ranges) for x in tf.nest.flatten(structure)]
  return [
    tf.nest.pack_sequence_as(structure, [pieces[i] for pieces in flat])
    for i in range(len(ranges))
  ]


def per_example_loss(
  model: keras.Model, batch: LossInputs, slices: int
) -> tf.Tensor:
  """`model.per_example_loss(batch)` `[B]`, computed slice by slice when
  `slices` > 1 (slices of a batch smaller than `slices` may be empty)."""
  if slices <= 1:
    return model.per_example_loss(batch)
  first = tf.nest.flatten(batch.activations)[0]
  rows = first.shape[0]
  if rows is None:  # a dataset that keeps its last, smaller batch
    rows = tf.shape(first)[0]
  ranges = bounds(rows, slices)
  parts = [
    model.per_example_loss(
      batch.replace(
        activations=acts, features=feats, labels=labs, sample_weight=weights
      )
    )
    for acts, feats, labs, weights in zip(
      _cut(batch.activations, ranges),
      _cut(batch.features, ranges),
      _cut(batch.labels, ranges),
      _cut(batch.sample_weight, ranges),
    )
  ]
  return tf.concat(parts, axis=0)


__all__ = [
  "AUTO_SLICES",
  "MIN_SLICE_EXAMPLES",
  "SlicePlan",
  "PER_EXAMPLE_LAYERS",
  "batch_coupled_layer",
  "bounds",
  "per_example_loss",
  "resolve",
  "unknown_layer",
]
