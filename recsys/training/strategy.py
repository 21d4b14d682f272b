"""Builds the `tf.distribute` strategy a run trains under.

One function, `make_strategy`, decides: a TPU address (or "local") ->
`TPUStrategy`; a `TF_CONFIG` cluster with parameter servers ->
`ParameterServerStrategy`, with several workers ->
`MultiWorkerMirroredStrategy`; GPUs -> `MirroredStrategy` over all of them
(one GPU -> `OneDeviceStrategy`); else the CPU, either the default strategy or
`MirroredStrategy` over `num_cpu_replicas` logical CPUs (replicas on one
machine, for tests and for checking multi-replica numerics).

Example:
  >>> strategy, why = make_strategy()          # CPU here
  >>> strategy, why = make_strategy(num_cpu_replicas=2)
"""

import json
import logging
import os
from typing import Optional, Tuple

from recsys._keras import tf

log = logging.getLogger("recsys.training")


class StrategyError(RuntimeError):
  """The requested strategy cannot be built here."""


def _tf_config() -> dict:
  raw = os.environ.get("TF_CONFIG", "")
  if not raw:
    return {}
  try:
    return json.loads(raw)
  except json.JSONDecodeError as e:
    raise StrategyError(f"TF_CONFIG is not valid JSON ({e}); got {raw[:200]!r}."
                       ) from e


def logical_cpus(num: int) -> list:
  """Makes (if still possible) and returns `num` logical CPU devices.

  Raises:
    StrategyError: the TF runtime is already initialised with fewer logical
      CPUs than `num` (logical devices can only be set before first use).
  """
  cpus = tf.config.list_logical_devices("CPU")
  if len(cpus) >= num:
    return cpus[:num]
  physical = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        physical, [tf.config.LogicalDeviceConfiguration()] * num)
  except RuntimeError as e:
    raise StrategyError(
        f"need {num} logical CPUs for num_cpu_replicas={num} but TensorFlow is "
        f"already initialised with {len(cpus)}; set num_cpu_replicas before any "
        "TensorFlow op runs (e.g. as the first thing in the process).") from e
  return tf.config.list_logical_devices("CPU")[:num]


def make_strategy(tpu: Optional[str] = None,
                  num_cpu_replicas: int = 0,
                  use_gpus: bool = True) -> Tuple[tf.distribute.Strategy, str]:
  """Builds the strategy for this machine or cluster.

  Args:
    tpu: a TPU address (`grpc://...`, a TPU name) or "local" for a TPU VM;
      None -> no TPU.
    num_cpu_replicas: > 1 -> MirroredStrategy over that many logical CPUs
      (ignored when a TPU, a cluster or GPUs are used).
    use_gpus: use the GPUs if there are any.

  Returns:
    (strategy, a one-line description of what was chosen and why).

  Raises:
    StrategyError: the TPU cannot be reached, TF_CONFIG is malformed, or the
      logical CPUs cannot be made.
  """
  if tpu:
    try:
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
          tpu="" if tpu == "local" else tpu)
      if tpu != "local":
        tf.config.experimental_connect_to_cluster(resolver)
      tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
      raise StrategyError(
          f"cannot reach TPU {tpu!r}: {e}. Pass --tpu=local on a TPU VM or the "
          "TPU's name/grpc address; omit --tpu to train on CPU/GPU.") from e
    return tf.distribute.TPUStrategy(resolver), f"TPUStrategy on TPU {tpu!r}"

  cluster = _tf_config().get("cluster", {})
  if cluster.get("ps"):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return (tf.distribute.experimental.ParameterServerStrategy(resolver),
            f"ParameterServerStrategy from TF_CONFIG ({len(cluster['ps'])} ps, "
            f"{len(cluster.get('worker', []))} workers)")
  workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
  if workers > 1:
    return (tf.distribute.MultiWorkerMirroredStrategy(),
            f"MultiWorkerMirroredStrategy from TF_CONFIG ({workers} workers)")

  gpus = tf.config.list_logical_devices("GPU") if use_gpus else []
  if len(gpus) > 1:
    return (tf.distribute.MirroredStrategy([d.name for d in gpus]),
            f"MirroredStrategy over {len(gpus)} GPUs")
  if len(gpus) == 1:
    return (tf.distribute.OneDeviceStrategy(gpus[0].name),
            f"OneDeviceStrategy on {gpus[0].name}")
  if num_cpu_replicas > 1:
    cpus = logical_cpus(num_cpu_replicas)
    return (tf.distribute.MirroredStrategy([d.name for d in cpus]),
            f"MirroredStrategy over {num_cpu_replicas} logical CPUs")
  return tf.distribute.get_strategy(), "default strategy on the CPU"
