"""Backend registry: names -> classes, and the automatic choice of backend.

Built-in backends are a literal name -> "module:Class" map imported lazily;
third-party backends register under the entry-point group `recsys.backends`.
`select()` is the one function that resolves "auto".
"""

import difflib
import importlib
import logging
from importlib import metadata
from typing import Any

import tensorflow as tf

from backends.base import EmbeddingBackend

log = logging.getLogger("recsys.backends")

ENTRY_POINT_GROUP = "recsys.backends"

_BUILTIN: dict[str, str] = {
  "tensorcore": "backends.tensorcore:TensorCoreEmbedding",
  "tpu_embedding": "backends.tpu_embedding:TPUEmbeddingBackend",
  "tpu_embedding_v0": "backends.tpu_embedding_v0:TPUEmbeddingV0Backend",
  "sharded": "backends.sharded:ShardedEmbedding",
  "serving": "backends.serving:ServingEmbedding",
}


class UnknownBackendError(ValueError):
  """No backend is registered under the requested name."""


def _entry_points() -> dict[str, Any]:
  try:
    return {
      ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
  except Exception:  # noqa: BLE001 - a broken third-party install must not hide built-ins
    log.warning(
      "could not read entry points %r", ENTRY_POINT_GROUP, exc_info=True
    )
    return {}


def names() -> list[str]:
  """Every registered backend name, built-in and third-party, sorted."""
  return sorted(set(_BUILTIN) | set(_entry_points()))


def get(name: str) -> type[EmbeddingBackend]:
  """The backend class registered under `name`.

  Raises:
    UnknownBackendError: no such name; the message suggests the closest
      name (a typo) and lists the valid ones.
  """
  if name in _BUILTIN:
    module_name, class_name = _BUILTIN[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)
  eps = _entry_points()
  if name in eps:
    cls = eps[name].load()
    if not (isinstance(cls, type) and issubclass(cls, EmbeddingBackend)):
      raise TypeError(
        f"entry point {name!r} in group {ENTRY_POINT_GROUP!r} "
        f"loads {cls!r}, which is not an EmbeddingBackend subclass."
      )
    return cls
  valid = names()
  raise UnknownBackendError(
    f"unknown embedding backend {name!r};{_did_you_mean(name, valid)} "
    f"available: {', '.join(valid)} (third-party backends register under "
    f"the entry-point group {ENTRY_POINT_GROUP!r})."
  )


def _did_you_mean(name: Any, valid: list[str]) -> str:
  """' did you mean 'x'?' for the closest valid name (typos), else ''."""
  if not isinstance(name, str):
    return f" got a {type(name).__name__}, expected a backend name string;"
  close = difflib.get_close_matches(name.lower(), valid, n=1, cutoff=0.6)
  return f" did you mean {close[0]!r}?" if close else ""


def available(strategy: tf.distribute.Strategy | None = None) -> list[str]:
  """Names of the backends that can run under `strategy` (default: current)."""
  strategy = strategy or tf.distribute.get_strategy()
  return [n for n in names() if get(n).unavailable_reason(strategy) is None]


def _embedding_feature(strategy: tf.distribute.Strategy) -> Any | None:
  """The TPU's embedding feature, or None when the strategy is not on a TPU."""
  hardware = getattr(strategy.extended, "tpu_hardware_feature", None)
  if hardware is None:
    return None
  return hardware.embedding_feature


def _is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
  ps_classes = (tf.distribute.experimental.ParameterServerStrategy,)
  return isinstance(strategy, ps_classes)


def select(
  strategy: tf.distribute.Strategy | None = None,
) -> tuple[str, str]:
  """Chooses a backend for `strategy`; returns (name, human-readable reason).

  TPU with embedding feature V2 (SparseCore) or V1 -> tpu_embedding;
  TPU without an embedding accelerator (UNSUPPORTED) -> tensorcore;
  ParameterServerStrategy -> sharded; anything else (CPU, GPU, mirrored,
  multi-worker) -> tensorcore.
  """
  strategy = strategy or tf.distribute.get_strategy()
  strategy_name = type(strategy).__name__
  feature = _embedding_feature(strategy)
  if feature is not None:
    kinds = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
    if feature == kinds.V2:
      return "tpu_embedding", (
        f"{strategy_name}, embedding_feature=V2: SparseCore runs TPUEmbeddingV2"
      )
    if feature == kinds.V1:
      return "tpu_embedding", (
        f"{strategy_name}, embedding_feature=V1: the "
        "embedding engine runs TPUEmbedding"
      )
    return "tensorcore", (
      f"{strategy_name}, embedding_feature={feature.name}: "
      "no embedding accelerator, tables replicated on the "
      "TensorCores"
    )
  if _is_parameter_server(strategy):
    return "sharded", (
      f"{strategy_name}: tables row-sharded over the parameter servers"
    )
  try:
    devices = tuple(strategy.extended.worker_devices)
  except RuntimeError:  # the default strategy has no device list
    devices = ()
  where = ", ".join(devices) if devices else "the default device"
  return "tensorcore", (
    f"{strategy_name} on {where}: tables replicated, "
    "lookups on the compute devices"
  )


def resolve(
  backend: str, strategy: tf.distribute.Strategy | None = None
) -> tuple[str, str]:
  """Resolves a backend request ("auto" or a name) to (name, reason)."""
  strategy = strategy or tf.distribute.get_strategy()
  if backend == "auto":
    name, reason = select(strategy)
    log.info("embedding backend auto -> %s (%s)", name, reason)
    return name, reason
  cls = get(backend)
  why_not = cls.unavailable_reason(strategy)
  if why_not:
    from backends.base import BackendUnavailableError  # pylint: disable=g-import-not-at-top

    runnable = available(strategy)
    auto_name, _ = select(strategy)
    hint = (
      f"Use backend='auto' (here: {auto_name!r}) or one of "
      f"{', '.join(runnable)}."
      if auto_name in runnable
      else f"Runnable here: {', '.join(runnable) or 'none'}."
    )
    raise BackendUnavailableError(
      f"embedding backend {backend!r} was requested but cannot run under "
      f"{type(strategy).__name__}: {why_not}. {hint}"
    )
  reason = f"forced by configuration under {type(strategy).__name__}"
  log.info("embedding backend %s (%s)", backend, reason)
  return backend, reason


def create(
  feature_config: Any,
  optimizer: Any | None = None,
  strategy: tf.distribute.Strategy | None = None,
  backend: str = "auto",
  **options: Any,
) -> EmbeddingBackend:
  """Constructs the backend for `strategy` (not built; call `build()`).

  Args:
    feature_config: nested structure of `tf.tpu.experimental.embedding.FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: defaults to the current strategy.
    backend: "auto" or a registered name (see `names()`).
    **options: backend-specific keyword arguments.
  """
  strategy = strategy or tf.distribute.get_strategy()
  name, _ = resolve(backend, strategy)
  return get(name)(feature_config, optimizer, strategy=strategy, **options)
