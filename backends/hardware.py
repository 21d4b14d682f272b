"""What a `tf.distribute` strategy runs on: the one place that asks.

Which TPU embedding feature a strategy's TPU has, whether it is a
parameter-server or a TPU strategy, and what kinds of devices its replicas
run on. The backend registry, the backends, the compile plan and the
trainer all ask here instead of repeating the `isinstance` checks.

Example:
  >>> import tensorflow as tf
  >>> from backends import hardware
  >>> hardware.is_parameter_server(tf.distribute.get_strategy())
  False
  >>> hardware.device_kinds(tf.distribute.get_strategy())
  {'CPU'}
"""

from typing import Any

import tensorflow as tf

_TPU_STRATEGIES = (
  tf.distribute.TPUStrategy,
  tf.distribute.experimental.TPUStrategy,
)


def embedding_feature(strategy: tf.distribute.Strategy) -> Any | None:
  """The TPU's embedding feature, or None when the strategy is not on a TPU.

  Returns:
    A `tf.tpu.experimental.HardwareFeature.EmbeddingFeature` (V1, V2,
    UNSUPPORTED) or None.
  """
  hardware = getattr(strategy.extended, "tpu_hardware_feature", None)
  if hardware is None:
    return None
  return hardware.embedding_feature


def is_tpu(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` is a `TPUStrategy` (its steps are compiled)."""
  return isinstance(strategy, _TPU_STRATEGIES)


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` is a `ParameterServerStrategy` (a coordinator)."""
  return isinstance(
    strategy, tf.distribute.experimental.ParameterServerStrategy
  )


def worker_devices(strategy: tf.distribute.Strategy) -> tuple[str, ...]:
  """The devices the replicas run on; () for the default strategy."""
  try:
    return tuple(strategy.extended.worker_devices)
  except RuntimeError:  # the default strategy has no device list
    return ()


def device_kinds(strategy: tf.distribute.Strategy) -> set[str]:
  """The device types (`"CPU"`, `"GPU"`, ...) the replicas run on."""
  return {
    (tf.DeviceSpec.from_string(d).device_type or "CPU").upper()
    for d in worker_devices(strategy)
  } or {"CPU"}


def num_tasks(strategy: tf.distribute.Strategy, job: str) -> int:
  """Tasks of `job` ("ps", "worker") in the cluster `strategy` runs on.

  The trainer counts workers, the memory planner parameter servers, the
  parameter-server storage its row ranges: all ask here.

  `ParameterServerStrategy` has no public `cluster_resolver`; it connects
  this process to its cluster, whose remote devices are listed by
  `tf.config.list_logical_devices()`.
  """
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is not None:
    try:
      return resolver.cluster_spec().num_tasks(job)
    except (ValueError, KeyError):
      return 0
  tasks = set()
  for device in tf.config.list_logical_devices():
    spec = tf.DeviceSpec.from_string(device.name)
    if spec.job == job:
      tasks.add(spec.task)
  return len(tasks)


def synchronous_processes(strategy: tf.distribute.Strategy) -> int:
  """Worker processes that train one global batch together: a cluster's
  workers and chief; 1 on parameter servers (each worker's batch is a step
  of its own) and in one process."""
  if is_parameter_server(strategy):
    return 1
  return max(1, num_tasks(strategy, "worker") + num_tasks(strategy, "chief"))


def is_multi_client(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` runs in several processes, each with its replicas.

  A `MultiWorkerMirroredStrategy` of more than one worker: each process
  holds only its own replicas' variables.
  """
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return False
  return num_tasks(strategy, "worker") + num_tasks(strategy, "chief") > 1


__all__ = [
  "device_kinds",
  "is_multi_client",
  "embedding_feature",
  "is_parameter_server",
  "is_tpu",
  "num_tasks",
  "synchronous_processes",
  "worker_devices",
]
