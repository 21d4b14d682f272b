"""Backend registry: names -> classes, and the automatic choice of backend.

Built-in backends are a literal name -> "module:Class" map imported lazily;
third-party backends register under the entry-point group `recsys.backends`.
`select()` is the one function that resolves "auto".
"""

import importlib
import logging
import warnings
from collections.abc import Mapping
from importlib import metadata
from typing import Any

import tensorflow as tf

from backends import hardware, suggest
from backends.base import BackendUnavailableError, EmbeddingBackend
from backends.errors import BackendSettingsError
from backends.layout import TableLayout

log = logging.getLogger("recsys.backends")

ENTRY_POINT_GROUP = "recsys.backends"

_BUILTIN: dict[str, str] = {
  "tensorcore": "backends.tensorcore.backend:TensorCoreEmbedding",
  "tpu_embedding": "backends.mid_level.tpu_embedding:TPUEmbeddingBackend",
  "tpu_embedding_v0": (
    "backends.mid_level.tpu_embedding_v0:TPUEmbeddingV0Backend"
  ),
  "parameter_servers": (
    "backends.parameter_servers.backend:ParameterServerEmbedding"
  ),
  "serving": "backends.mid_level.serving:ServingEmbedding",
}


#: Old names of built-in backends, still accepted (gin's `train.backend`,
#: `--backend`, `backends.create`) with a one-time warning naming the new.
_RENAMED: dict[str, str] = {"sharded": "parameter_servers"}
_warned: set[str] = set()


def canonical(name: Any) -> Any:
  """`name`, or the current name of a renamed built-in backend: the old
  name works, with a FutureWarning (once per name and process) naming the
  new one."""
  new = _RENAMED.get(name) if isinstance(name, str) else None
  if new is None:
    return name
  if name not in _warned:
    _warned.add(name)
    message = (
      f"embedding backend {name!r} is deprecated: it is now called "
      f"{new!r} (train.backend = {new!r}, --backend {new})."
    )
    warnings.warn(message, FutureWarning, stacklevel=3)
  return new


class UnknownBackendError(BackendSettingsError, ValueError):
  """No backend is registered under the requested name."""


class UnknownBackendOptionError(BackendSettingsError, ValueError):
  """An option the backend does not declare (`EmbeddingBackend.options`)."""


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
  name = canonical(name)
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
  close = suggest.closest(name, valid, n=1)
  return f" did you mean {close[0]!r}?" if close else ""


def on_tensor_cores() -> str:
  """The backend that keeps the tables on a TPU's TensorCores: what "auto"
  picks on a TPU without an embedding accelerator, and what TFRS's
  `embedding_feature=UNSUPPORTED` asks for (`recsys.layers.Embedding`)."""
  return "tensorcore"


def for_export() -> str:
  """The backend a SavedModel export restores a run on: it reads any
  training backend's checkpoint (SparseCore's stacked tables included) on
  CPU and serves lookups in the exported graph (`recsys export`)."""
  return "serving"


def available(strategy: tf.distribute.Strategy | None = None) -> list[str]:
  """Names of the backends that can run under `strategy` (default: current)."""
  strategy = strategy or tf.distribute.get_strategy()
  return [n for n in names() if get(n).unavailable_reason(strategy) is None]


def select(
  strategy: tf.distribute.Strategy | None = None,
) -> tuple[str, str]:
  """Chooses a backend for `strategy`; returns (name, human-readable reason).

  TPU with embedding feature V2 (SparseCore) or V1 -> tpu_embedding;
  TPU without an embedding accelerator (UNSUPPORTED) -> tensorcore;
  ParameterServerStrategy -> parameter_servers; anything else (CPU, GPU,
  mirrored, multi-worker) -> tensorcore.
  """
  strategy = strategy or tf.distribute.get_strategy()
  strategy_name = type(strategy).__name__
  feature = hardware.embedding_feature(strategy)
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
    return on_tensor_cores(), (
      f"{strategy_name}, embedding_feature={feature.name}: "
      "no embedding accelerator, tables on the TensorCores "
      "(replicated or row-sharded, per table)"
    )
  if hardware.is_parameter_server(strategy):
    return "parameter_servers", (
      f"{strategy_name}: tables split over the parameter servers"
    )
  devices = hardware.worker_devices(strategy)
  where = ", ".join(devices) if devices else "the default device"
  return "tensorcore", (
    f"{strategy_name} on {where}: tables on the compute devices "
    "(replicated or row-sharded, per table)"
  )


def decide(
  backend: str, strategy: tf.distribute.Strategy | None = None
) -> tuple[str, str, str | None]:
  """What a backend request means under `strategy`, without acting on it.

  Args:
    backend: "auto" or a registered name.
    strategy: defaults to the current strategy.

  Returns:
    `(name, reason, why_not)`: the backend, why it was chosen, and why it
    cannot run under `strategy` (None: it can). "auto" always can.

  Raises:
    UnknownBackendError: `backend` is not a registered name.
  """
  backend = canonical(backend)
  strategy = strategy or tf.distribute.get_strategy()
  if backend == "auto":
    name, reason = select(strategy)
    return name, reason, None
  why_not = get(backend).unavailable_reason(strategy)
  return (
    backend,
    f"forced by configuration under {type(strategy).__name__}",
    (why_not or None),
  )


def resolve(
  backend: str, strategy: tf.distribute.Strategy | None = None
) -> tuple[str, str]:
  """Resolves a backend request ("auto" or a name) to (name, reason).

  The one place a run's backend is decided: logs the choice and its reason.

  Raises:
    UnknownBackendError: `backend` is not a registered name.
    BackendUnavailableError: the named backend cannot run under `strategy`;
      the message lists the ones that can.
  """
  backend = canonical(backend)
  strategy = strategy or tf.distribute.get_strategy()
  name, reason, why_not = decide(backend, strategy)
  if backend == "auto":
    log.info("embedding backend auto -> %s (%s)", name, reason)
    return name, reason
  if why_not:
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
  log.info("embedding backend %s (%s)", backend, reason)
  return backend, reason


def sharding_backends() -> str:
  """Which built-in backends split tables over devices, and where: the
  advice of a memory plan that does not fit (`recsys.planning`)."""
  return (
    "'tpu_embedding' on TPUs with an embedding accelerator, "
    "'parameter_servers' on "
    "parameter servers, tensorcore row-sharded over several replicas"
  )


def dynamic_vocabulary_backends() -> str:
  """The built-in backends that map raw ids to rows
  (`Capabilities.dynamic_vocabularies`), for a refusal's advice."""
  capable = sorted(
    name for name in names() if get(name).capabilities.dynamic_vocabularies
  )
  return ", ".join(repr(n) for n in capable)


def parameter_server_partitioner(num_ps: int) -> Any:
  """The `variable_partitioner` a `ParameterServerStrategy` is built with.

  The parameter-server backend (`parameter_servers`) splits its tables over the
  `num_ps` servers through it; every other variable stays whole. Strategy
  builders ask here, so they never import that backend's modules.
  """
  from backends.parameter_servers import storage as parameter_servers  # pylint: disable=g-import-not-at-top

  return parameter_servers.TablePartitioner(num_ps)


def check_options(name: str, options: Mapping[str, Any]) -> None:
  """Checks `options` against what the backend `name` declares it accepts.

  Raises:
    UnknownBackendOptionError: an option the backend does not declare in its
      `options` class attribute; the message lists the accepted ones.
  """
  name = canonical(name)
  accepted = get(name).options
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise UnknownBackendOptionError(
      f"{unknown} are not options of the {name!r} backend; it takes "
      f"{sorted(accepted)}."
    )


def declared_options(
  name: str, candidates: Mapping[str, Any]
) -> dict[str, Any]:
  """The `candidates` backend `name` declares among its options: what a
  caller offers every backend (the Keras layer's TPU arguments, a compiled
  run's static shapes) goes only to those that take it, asked here so no
  caller tests a backend's option names."""
  accepted = get(name).options
  return {k: v for k, v in candidates.items() if k in accepted}


def takes_layouts(cls: type[EmbeddingBackend]) -> bool:
  """Whether backend class `cls` is given the planned `layouts` (never a
  `train.backend_options` key): one built from layouts
  (`Capabilities.layouts`), or one that reads their vocabularies
  (`Capabilities.dynamic_vocabularies`)."""
  capable = cls.capabilities
  return bool(capable.layouts or capable.dynamic_vocabularies)


def construct(
  name: str,
  feature_config: Any,
  optimizer: Any | None,
  strategy: tf.distribute.Strategy | None,
  layouts: TableLayout | Mapping[str, TableLayout] | None = None,
  **options: Any,
) -> EmbeddingBackend:
  """Backend `name` (resolved already), with each table's planned
  `TableLayout` where it is built from layouts (`Capabilities.layouts`;
  the others place their tables themselves and report it, `layouts()`)."""
  cls = get(name)
  if takes_layouts(cls) and layouts is not None:
    options["layouts"] = layouts
  return cls(feature_config, optimizer, strategy=strategy, **options)


def create(
  feature_config: Any,
  optimizer: Any | None = None,
  strategy: tf.distribute.Strategy | None = None,
  backend: str = "auto",
  layouts: TableLayout | Mapping[str, TableLayout] | None = None,
  **options: Any,
) -> EmbeddingBackend:
  """Constructs the backend for `strategy` (not built; call `build()`).

  Args:
    feature_config: nested structure of
      `tf.tpu.experimental.embedding.FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: defaults to the current strategy.
    backend: "auto" or a registered name (see `names()`).
    layouts: a `backends.layout.TableLayout` for every table, or table
      name -> one, for a backend built from layouts (`recsys.planning`
      plans them); ignored by the others, which place their tables
      themselves.
    **options: backend-specific keyword arguments.
  """
  strategy = strategy or tf.distribute.get_strategy()
  name, _ = resolve(backend, strategy)
  check_options(name, options)
  return construct(
    name, feature_config, optimizer, strategy, layouts, **options
  )
