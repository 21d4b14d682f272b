"""Builds the `tf.distribute` strategy a run trains under.

One function, `make_strategy`, decides: a TPU address (or "local") ->
`TPUStrategy`; a `TF_CONFIG` cluster with parameter servers ->
`ParameterServerStrategy` with the embedding tables row-sharded over them
(on a worker or ps task: serve the chief instead), with several workers ->
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
import signal
import threading

from backends import hardware, registry
from recsys import _tf_internal
from recsys._keras import tf
from recsys.errors import RecsysError

log = logging.getLogger("recsys.training")


class StrategyError(RecsysError, RuntimeError):
  """The requested strategy cannot be built here."""


def _tf_config() -> dict:
  raw = os.environ.get("TF_CONFIG", "")
  if not raw:
    return {}
  try:
    return json.loads(raw)
  except json.JSONDecodeError as e:
    raise StrategyError(
      f"TF_CONFIG is not valid JSON ({e}); got {raw[:200]!r}."
    ) from e


def logical_cpus(num: int) -> list:
  """Makes (if still possible) and returns `num` logical CPU devices.

  Raises:
    StrategyError: the TF runtime is already initialised with fewer logical
      CPUs than `num` (logical devices can only be set before first use).
  """
  # Only physical devices and their configuration may be queried here:
  # listing logical devices starts TensorFlow's runtime, after which the CPU
  # can no longer be split.
  physical = tf.config.list_physical_devices("CPU")[0]
  configured = tf.config.get_logical_device_configuration(physical) or []
  if len(configured) < num:
    try:
      tf.config.set_logical_device_configuration(
        physical, [tf.config.LogicalDeviceConfiguration()] * num
      )
    except RuntimeError:  # already running: usable if it has enough CPUs
      pass
  cpus = tf.config.list_logical_devices("CPU")
  if len(cpus) < num:
    raise StrategyError(
      f"need {num} logical CPUs for num_cpu_replicas={num} but TensorFlow is "
      f"already initialised with {len(cpus)}; set num_cpu_replicas before any "
      "TensorFlow op runs (e.g. as the first thing in the process)."
    )
  return cpus[:num]


def serve(tf_config: dict) -> None:
  """Runs this worker or parameter-server task's gRPC server until killed.

  In a parameter-server cluster only the chief runs Python training code;
  workers and parameter servers run a `tf.distribute.Server` that executes
  what the chief's `ClusterCoordinator` sends them. The process exits when
  it is killed (the launcher stops it after the chief exits).
  """
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  task = tf_config.get("task", {})
  log.info(
    "serving as %s %s of %s",
    task.get("type"),
    task.get("index", 0),
    resolver.cluster_spec().as_dict(),
  )
  server = tf.distribute.Server(
    resolver.cluster_spec(),
    job_name=resolver.task_type,
    task_index=resolver.task_id,
    protocol=resolver.rpc_layer or "grpc",
    start=True,
  )
  if threading.current_thread() is threading.main_thread():
    # join() blocks in C++, where no Python signal handler (`recsys`'s
    # exit-143 one included) can run: let SIGTERM end the task at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  server.join()


def parameter_server_strategy(
  tf_config: dict,
) -> tuple[tf.distribute.Strategy, str]:
  """The chief's `ParameterServerStrategy` for a TF_CONFIG with a "ps" job.

  Embedding tables are row-sharded over every parameter server (the
  parameter_servers backend's `TablePartitioner`); other variables stay whole.
  On a "worker" or "ps" task this serves (`serve`) and does not return.

  Raises:
    StrategyError: the cluster has no "chief" (the coordinator) or no
      "worker" job, or this task's type is unknown.
  """
  cluster = tf_config.get("cluster", {})
  task_type = tf_config.get("task", {}).get("type")
  if not cluster.get("worker") or len(cluster.get("chief", [])) != 1:
    raise StrategyError(
      "a TF_CONFIG cluster with a 'ps' job needs exactly one 'chief' (the "
      "coordinator that runs `recsys train`) and at least one 'worker'; got "
      f"jobs {sorted(cluster)} with {len(cluster.get('chief', []))} chief(s) "
      f"and {len(cluster.get('worker', []))} worker(s)."
    )
  if task_type in ("worker", "ps"):
    serve(tf_config)
    raise SystemExit(0)
  if task_type != "chief":
    raise StrategyError(
      f"TF_CONFIG task type {task_type!r} is not one of 'chief', 'worker', "
      "'ps' (parameter-server training; an 'evaluator' is not supported)."
    )
  num_ps = len(cluster["ps"])
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  strategy = tf.distribute.experimental.ParameterServerStrategy(
    resolver,
    variable_partitioner=registry.parameter_server_partitioner(num_ps),
  )
  return strategy, (
    f"ParameterServerStrategy from TF_CONFIG ({num_ps} ps, "
    f"{len(cluster['worker'])} workers; tables row-sharded "
    f"over the {num_ps} ps)"
  )


def make_strategy(
  tpu: str | None = None, num_cpu_replicas: int = 0, use_gpus: bool = True
) -> tuple[tf.distribute.Strategy, str]:
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
        tpu="" if tpu == "local" else tpu
      )
      if tpu != "local":
        tf.config.experimental_connect_to_cluster(resolver)
      tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
      raise StrategyError(
        f"cannot reach TPU {tpu!r}: {e}. Pass --tpu=local on a TPU VM or the "
        "TPU's name/grpc address; omit --tpu to train on CPU/GPU."
      ) from e
    return tf.distribute.TPUStrategy(resolver), f"TPUStrategy on TPU {tpu!r}"

  tf_config = _tf_config()
  cluster = tf_config.get("cluster", {})
  if cluster.get("ps"):
    return parameter_server_strategy(tf_config)
  workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
  if workers > 1:
    return (
      tf.distribute.MultiWorkerMirroredStrategy(),
      f"MultiWorkerMirroredStrategy from TF_CONFIG ({workers} workers)",
    )

  # Physical devices first: listing logical ones starts the runtime, which
  # must not happen before the CPU is split into replicas.
  gpus = []
  if use_gpus and tf.config.list_physical_devices("GPU"):
    gpus = tf.config.list_logical_devices("GPU")
  if len(gpus) > 1:
    return (
      _tf_internal.mirrored_strategy([d.name for d in gpus]),
      f"MirroredStrategy over {len(gpus)} GPUs",
    )
  if len(gpus) == 1:
    return (
      tf.distribute.OneDeviceStrategy(gpus[0].name),
      f"OneDeviceStrategy on {gpus[0].name}",
    )
  if num_cpu_replicas > 1:
    cpus = logical_cpus(num_cpu_replicas)
    return (
      _tf_internal.mirrored_strategy([d.name for d in cpus]),
      f"MirroredStrategy over {num_cpu_replicas} logical CPUs",
    )
  return tf.distribute.get_strategy(), "default strategy on the CPU"


def _chief(task_type: str | None, task_id: int, cluster: dict) -> bool:
  """The chief task, or worker 0 of a cluster without one (or no cluster)."""
  if not task_type or task_type == "chief":
    return True
  return task_type == "worker" and "chief" not in cluster and not task_id


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """Whether this process writes the run's files (not a non-chief worker)."""
  resolver = getattr(strategy, "cluster_resolver", None)
  task_type = getattr(resolver, "task_type", None)
  if not task_type:
    return True
  spec = resolver.cluster_spec().as_dict() if resolver else {}
  return _chief(task_type, getattr(resolver, "task_id", 0) or 0, spec)


def is_chief_task() -> bool:
  """`is_chief` from this process's TF_CONFIG (True without a cluster)."""
  tf_config = _tf_config()
  task = tf_config.get("task", {})
  return _chief(
    task.get("type"), int(task.get("index", 0)), tf_config.get("cluster", {})
  )


def agreed_stop(
  strategy: tf.distribute.Strategy, requested: str | None
) -> str | None:
  """The stop signal, agreed by every worker so all save the same step."""
  resolver = getattr(strategy, "cluster_resolver", None)
  spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
  workers = len(spec.get("worker", [])) + len(spec.get("chief", []))
  if workers <= 1 or hardware.is_parameter_server(strategy):
    return requested
  flag = strategy.experimental_distribute_values_from_function(
    lambda _: tf.constant(1.0 if requested else 0.0)
  )
  agreed = strategy.reduce(tf.distribute.ReduceOp.SUM, flag, axis=None)
  return (requested or "SIGTERM") if float(agreed) > 0 else None


def make_coordinator(
  strategy: tf.distribute.Strategy,
) -> "tf.distribute.coordinator.ClusterCoordinator":
  """The `ClusterCoordinator` of a `ParameterServerStrategy` (one per
  strategy; made once): it schedules steps on the workers and holds the
  per-worker datasets (`recsys.training.coordinated`, `recsys.run.input`)."""
  return tf.distribute.coordinator.ClusterCoordinator(strategy)


def num_workers(strategy: tf.distribute.Strategy) -> int:
  """Workers in the strategy's cluster (tasks of job "worker")."""
  return max(1, hardware.num_tasks(strategy, "worker"))
