"""A run's gin settings: the files' `train.*`, made a `ConfiguredRun`.

Gin files bind `train.*` (data source, model class, embedding settings,
optimizers, batch size, steps); `configured_run` is the configurable they
bind (registered as `train`), and it returns what the run is made of —
the model dir, the data sources, the model, the strategy and the
`TrainSettings` — with no loop. `recsys evaluate` and `recsys export`
restore it (`ConfiguredRun.restored()`, a `RestoredRun`) without loading
`recsys.training`; `recsys train` hands the same object to the Trainer
(`recsys.training.train`). Objects that own variables (model, dense
optimizer) are passed as classes or factories (`@DLRM`,
`@keras.optimizers.Adam`) and built inside `strategy.scope()`; embedding
optimizers own no variables and are passed as instances
(`@embedding.Adagrad()`).

Example (gin):
  train.data = @SyntheticCTR()
  train.model = @DLRM
  train.embedding = @EmbeddingSettings()
  EmbeddingSettings.dim = 16
  train.embedding_optimizer = @embedding.Adagrad()
  embedding.Adagrad.learning_rate = 0.05
  train.dense_optimizer = @keras.optimizers.Adam
  train.global_batch_size = 1024
  train.train_steps = 2000
"""

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import gin

from backends import registry
from recsys import config, planning, ranges
from recsys import features as features_lib
from recsys._keras import keras, tf
from recsys.gin_config import compat as gin_compat
from recsys.model_dir import run_dir as run_dir_lib
from recsys.run import embedding_backend
from recsys.run import strategy as strategy_lib
from recsys.run.restored import RestoredRun, default_embedding_optimizer
from recsys.train_settings import TrainSettings

log = logging.getLogger("recsys.training")

#: What a configured run is for: train it (returns the final metrics),
#: evaluate its newest checkpoint, restore it (a `RestoredRun`) or build
#: its Trainer (`recsys.training.train.train`).
ACTIONS = ("train", "evaluate", "restore", "build")


def _instance(source: Any) -> Any:
  return source() if isinstance(source, type) else source


def configured_strategy(
  tpu: str | None = None,
) -> tuple[tf.distribute.Strategy, str]:
  """The strategy the parsed gin config's `train` asks for, built now.

  Call it after parsing and before gin calls `train`, which first builds its
  arguments (data sources may run TF ops): multi-worker collectives, TPUs
  and logical CPUs must be configured before TensorFlow's runtime starts.
  The caller passes the strategy to `train` (`strategy=`), which then
  builds none.

  Args:
    tpu: the TPU (e.g. the `--tpu` flag); None: the config's `train.tpu`.

  Returns:
    `(strategy, why)` from `recsys.run.strategy.make_strategy`, with
    the config's `train.num_cpu_replicas`.
  """
  tpu = tpu or config.value("train.tpu")
  num_cpu_replicas = config.value("train.num_cpu_replicas") or 0
  strategy, why = strategy_lib.make_strategy(tpu, int(num_cpu_replicas))
  log.info("strategy: %s", why)
  return strategy, why


def configured_settings() -> TrainSettings:
  """The `TrainSettings` the parsed gin config gives `train`, without it.

  Each bound `train.<setting>` evaluated as gin passes it (`@X()` called,
  macros read), the others their defaults: for tools that plan from a
  config (e.g. how many examples evaluation scores) without a Trainer.
  """
  names = {f.name for f in dataclasses.fields(TrainSettings)}
  bound = gin.get_bindings("train", resolve_references=False)
  return TrainSettings(
    **{
      name: gin_compat.evaluate(value)
      for name, value in bound.items()
      if name in names  # not train's own objects (data, model, ...)
    }
  )


#: `configured_feature_specs`'s answer: (the specs or None, a note).
FeatureSpecs = tuple[list[Any] | None, str]


def configured_embedding(
  backend: str | None = None, feature_specs: FeatureSpecs | None = None
) -> tuple[dict[str, Any] | None, Any, str, str]:
  """`(feature_config, embedding_optimizer, backend, note)` of the config.

  What `recsys info` plans memory for: the tables `train` would build from
  `train.data` and `train.embedding` (None without `train.data`), the
  embedding optimizer (the trainer's default without one) and the backend
  request (`backend` overrides `train.backend`). When the data source cannot
  be built here (its files are not downloaded yet, its folder's macro is
  unbound), the tables come from the sizes its settings give, if it can
  tell them without its files (`feature_specs_without_files`), and `note`
  says so; otherwise feature_config is None and `note` says why.
  `feature_specs`: `configured_feature_specs()`'s answer, if asked already
  (building a source can take a while; None: asked here).
  """
  specs, note = feature_specs or configured_feature_specs()
  feature_config = None
  if specs is not None:
    feature_config = features_lib.feature_config(
      specs, config.value("train.embedding")
    )
  optimizer = config.value("train.embedding_optimizer")
  if optimizer is None:
    optimizer = default_embedding_optimizer()
  backend = backend or config.value("train.backend") or "auto"
  return feature_config, optimizer, backend, note


def configured_feature_specs() -> FeatureSpecs:
  """The data source's feature specs, built or planned without its files,
  and a note saying how (`configured_embedding`)."""
  found = gin_compat.referenced_configurable("train.data")
  settings: dict[str, Any] = {}
  unbound = []
  for name, value in (found[1] if found else {}).items():
    try:
      settings[name] = gin_compat.evaluate(value)
    except (OSError, ValueError, RuntimeError):
      continue
    if settings[name] is gin.REQUIRED:  # e.g. CRITEO_DIR not bound yet
      unbound.append(str(value).lstrip("%"))
      del settings[name]
  if unbound:
    reason = f"{', '.join(unbound)} is not bound"
  else:
    try:
      source = config.value("train.data")
      if source is None:
        return None, ""
      return list(_instance(source).feature_specs), ""
    except (OSError, ValueError, RuntimeError) as e:  # e.g. no files yet
      reason = gin_compat.without_call_trail(str(e)).strip()
  plan = (
    getattr(found[0], "feature_specs_without_files", None) if found else None
  )
  specs = plan(**settings) if plan is not None else None
  name = found[0].__name__ if found else "train.data"
  if specs is None:
    return None, (
      f"no memory plan: {name} takes its vocabulary sizes from its files, "
      f"which cannot be read here ({reason})"
    )
  return specs, (
    f"planned from {name}'s vocabulary sizes in the gin config, without "
    f"its data files ({reason})"
  )


def configured_plan(
  feature_config: dict[str, Any] | None,
  optimizer: Any,
  backend: str,
  strategy: tf.distribute.Strategy,
  feature_specs: FeatureSpecs | None = None,
) -> planning.MemoryPlan | None:
  """`recsys info`'s memory plan: the one `train` would make and check.

  From the parsed config's `train.placement`, `train.backend_options` and
  `train.global_batch_size`, and `train.data`'s bag widths (built or
  planned without its files, as `configured_embedding` does), through the
  function `train` plans with (`embedding_backend.plan_tables`): the same
  placements, the same refusals. None without tables. `feature_specs`: as
  for `configured_embedding`.

  Raises:
    TrainerConfigError, planning.PlacementSettingsError: as `train` would.
  """
  if feature_config is None:
    return None
  batch = config.value("train.global_batch_size")
  if batch is None:  # unbound: train's default
    batch = TrainSettings.global_batch_size
  settings = TrainSettings(
    placement=config.value("train.placement"),
    backend_options=config.value("train.backend_options"),
    global_batch_size=batch,
  )
  specs = (feature_specs or configured_feature_specs())[0]
  widths = embedding_backend.bag_widths(specs) if specs is not None else {}
  name, _, _ = registry.decide(backend, strategy)
  return embedding_backend.plan_tables(
    settings, strategy, feature_config, optimizer, name, widths
  )


@dataclasses.dataclass(frozen=True)
class ConfiguredRun:
  """What the gin settings make a run of, before anything is built.

  Attributes:
    model_dir: the run folder.
    source: the training data source (built: `train.data`).
    model: the model class or factory (`train.model`), built later inside
      the strategy's scope.
    strategy: the `tf.distribute` strategy the run uses.
    eval_source: the evaluation source, or None (the training source's
      eval split).
    settings: every other `train.<name>`, by name (`TrainSettings`).
  """

  model_dir: str
  source: Any
  model: Callable[..., keras.Model]
  strategy: tf.distribute.Strategy
  eval_source: Any | None
  settings: TrainSettings

  def restored(self, lookup_only: bool = False) -> RestoredRun:
    """The run's objects built and its newest checkpoint read; no loop
    (what `recsys evaluate` and `recsys export` use, `lookup_only`: see
    `RestoredRun`)."""
    return RestoredRun(
      self.model_dir,
      self.source,
      self.model,
      self.strategy,
      self.eval_source,
      self.settings,
      lookup_only=lookup_only,
    )


@gin.configurable("train")
@ranges.checked(name="train", fields_of=TrainSettings)
def configured_run(
  model_dir: ranges.Name,
  data: Any = gin.REQUIRED,
  model: Callable[..., keras.Model] = gin.REQUIRED,
  eval_data: Any | None = None,
  embedding: features_lib.EmbeddingSettings | None = None,
  embedding_optimizer: Any | None = None,
  dense_optimizer: Callable[[], Any] | None = None,
  backend: str = "auto",
  backend_options: Mapping[str, Any] | None = None,
  tpu: ranges.Name | None = None,
  num_cpu_replicas: ranges.NonNegativeInt = 0,
  global_batch_size: int = 1024,
  eval_batch_size: int | None = None,
  train_steps: int = 1000,
  steps_per_loop: int = 100,
  eval_every: int = 0,
  eval_steps: int | None = 20,
  checkpoint_every: int = 0,
  max_checkpoints: int = 3,
  seed: int = 0,
  progress_bar: bool = True,
  summaries: bool = True,
  nonfinite_policy: str = "stop",
  jit_compile: bool | None = None,
  batch_slices: int | None = None,
  allow_changed_settings: bool = False,
  skip_memory_check: bool = False,
  exclude_seen: bool = False,
  placement: Any | None = None,
  strategy: tf.distribute.Strategy | None = None,
  action: Annotated[str, ranges.Choice(ACTIONS)] = "train",
  feature_config: Mapping[str, Any] | None = None,
) -> ConfiguredRun:
  """The gin-configured `train`: the strategy, sources and settings of a run.

  Args:
    model_dir: where checkpoints, summaries, `operative_config.gin` and
      `metrics.json` go; an existing run there is resumed.
    data: the training data source (e.g. `@SyntheticCTR()`).
    model: model class or factory (e.g. `@DLRM`), built inside the scope.
    eval_data: evaluation source (default: `data` with training=False).
    tpu: TPU address or "local"; None: no TPU.
    num_cpu_replicas: > 1: MirroredStrategy over that many logical CPUs.
    strategy: an already built strategy (Python callers; overrides `tpu`).
    action: what the run is for (`ACTIONS`): only "train" needs a writable
      model dir (checked now, before anything takes time) and writes
      summaries.
    Every other parameter is a `TrainSettings` field (documented there, with
    the same default and valid range): the settings the run gets, each
    passed by name. Every argument is checked against its declared range
    (`recsys.ranges`) before anything is built.

  Raises:
    ranges.SettingRangeError: an argument outside its declared range (an
      unknown action too).
    ModelDirNotWritableError: action "train" in a model dir this user may
      not write.
  """
  if action == "train":  # before start-up and restore, which take time
    run_dir_lib.RunDir(model_dir).check_writable()
  if strategy is None:
    strategy, why = strategy_lib.make_strategy(tpu, num_cpu_replicas)
    log.info("strategy: %s", why)
  settings = TrainSettings(
    embedding=embedding,
    embedding_optimizer=embedding_optimizer,
    dense_optimizer=dense_optimizer,
    backend=backend,
    backend_options=backend_options,
    global_batch_size=global_batch_size,
    eval_batch_size=eval_batch_size,
    train_steps=train_steps,
    steps_per_loop=steps_per_loop,
    eval_every=eval_every,
    eval_steps=eval_steps,
    checkpoint_every=checkpoint_every,
    max_checkpoints=max_checkpoints,
    seed=seed,
    progress_bar=progress_bar,
    # Only training writes summaries: the other actions just read the run.
    summaries=summaries and action == "train",
    nonfinite_policy=nonfinite_policy,
    jit_compile=jit_compile,
    batch_slices=batch_slices,
    allow_changed_settings=allow_changed_settings,
    skip_memory_check=skip_memory_check,
    exclude_seen=exclude_seen,
    placement=placement,
    feature_config=feature_config,
  )
  return ConfiguredRun(
    model_dir=model_dir,
    source=_instance(data),
    model=model,
    strategy=strategy,
    eval_source=_instance(eval_data) if eval_data is not None else None,
    settings=settings,
  )
