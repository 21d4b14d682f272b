"""A restored run: a run's objects built and its checkpoint read, no loop.

What `recsys evaluate` and `recsys export` need of a run, and what the
Trainer trains: the strategy, the data sources, the embedding backend
(`recsys.run.embedding_backend`: resolved, planned, memory-checked), the
model and its dense optimizer (built inside `strategy.scope()`), the step
counter and random generator, the run folder and its checkpoints
(`RunCheckpoints`: the newest readable one restored), and the model's
evaluation hooks (a retrieval model's corpus index and seen items). It has
no training loop: evaluation is `recsys.run.evaluation`, the SavedModel
`recsys.serving.export`, and `recsys.training.Trainer` adds the loop to one.

Example:
  >>> run = RestoredRun("runs/demo", SyntheticCTR(), DLRM,
  ...                   settings=TrainSettings(global_batch_size=512))
  >>> run.restored_step
  2000
  >>> evaluation.evaluate_restored(run)
"""

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import gin

from backends import hardware
from recsys import features as features_lib
from recsys import train_settings as settings_lib
from recsys._keras import keras, tf
from recsys.data import sources as data_sources
from recsys.data.from_dataset import DatasetSource
from recsys.model_dir import checkpoints as checkpoints_lib
from recsys.model_dir import run_checks, run_inputs
from recsys.model_dir import run_dir as run_dir_lib
from recsys.models import evaluation_hooks as hooks_lib
from recsys.models import model_args
from recsys.models.retrieval import seen_items as seen_lib
from recsys.run import embedding_backend as backend_lib
from recsys.run import input as input_lib
from recsys.run import memory_peaks, schedules
from recsys.run import strategy as strategy_lib
from recsys.serving.lookup import serving_activations
from recsys.train_settings import TrainerConfigError, TrainSettings

log = logging.getLogger("recsys.training")


def default_embedding_optimizer() -> Any:
  """The embedding optimizer of a run that names none: Adagrad(0.05)."""
  return tf.tpu.experimental.embedding.Adagrad(0.05)


def embed_fn(
  backend: Any, embed: Callable[..., tf.Tensor], feature_names
) -> Callable:
  """A compiled lookup + tower function for retrieval evaluation on one device.

  Args:
    backend: the built backend whose trained tables to read.
    embed: `model.query_embeddings` or `model.candidate_embeddings`.
    feature_names: the features `embed` reads (query or candidate features).

  Returns:
    `features -> [B, K]` embeddings, a `tf.function` (traced for the full
    batch, then once more for any other batch size).
  """

  def fn(features):
    return embed(
      serving_activations(backend, features, feature_names), features
    )

  return tf.function(fn, reduce_retracing=True)


def _transformed_first(transform, preprocess, features, labels, *mask):
  """`preprocess` of a batch whose features `transform` changed first."""
  return preprocess(transform(features), labels, *mask)


def check_no_float16(model: keras.Model) -> None:
  """Refuses a model that computes in float16 (a mixed_float16 policy).

  float16 gradients need loss scaling (Keras's `LossScaleOptimizer`, which
  `compile()` adds); the Trainer's step differentiates the loss as it is,
  so small gradients would silently round to zero. bfloat16 has float32's
  range and needs none: it is the TPU's policy.

  Raises:
    TrainerConfigError: naming the layer and its policy.
  """
  layers = [model] + [
    m for m in model.submodules if isinstance(m, keras.layers.Layer)
  ]
  for layer in layers:
    if layer.compute_dtype == "float16":
      raise TrainerConfigError(
        f"layer {layer.name!r} of the model computes in float16 (Keras "
        f"dtype policy {layer.dtype_policy.name!r}); float16 gradients need "
        "loss scaling, which the Trainer's step does not do, so small ones "
        "would silently become 0. Use "
        "tf.keras.mixed_precision.set_global_policy('mixed_bfloat16') (the "
        "TPU's policy: float32's range, no loss scaling) or 'float32' "
        "before building the Trainer."
      )


class RestoredRun:
  """One run's objects, built under one strategy and restored; no loop.

  Args:
    model_dir: the run folder: checkpoints, `operative_config.gin`, ...
      (created if new; an existing run there is restored).
    source: the training data source, a `recsys.data.DataSource` (or an
      unbatched `tf.data.Dataset` with the `feature_config` setting).
    model: a model class or factory, called inside `strategy.scope()` with
      the source's values of the arguments its kind declares
      (`recsys.models.model_args`).
    strategy: the `tf.distribute` strategy (default: the current one).
    eval_source: source for evaluation; default: `source` (its eval split).
    settings: the run's `TrainSettings` (default: the defaults).
    lookup_only: the tables alone, for a run restored to be evaluated or
      exported, not trained: a backend that declares `restore_only` holds
      no optimizer slots (restoring them would hold the tables three times
      under Adam) and draws no initial values.

  Attributes (besides the arguments): `feature_config`,
  `embedding_optimizer` (bound to the step's schedules), `global_step`,
  `backend` (and `backend_name`, `backend_reason`, `compile_plan`),
  `model`, `dense_optimizer`, `rng`, `run_dir`, `checkpoints`,
  `coordinator` (parameter servers only, else None), `chief`, `memory`
  (each phase's peak RSS) and `restored_step` (0: no checkpoint yet).

  Raises:
    TrainerConfigError, SourceSettingsError: settings that do not fit the
      sources, strategy or model (before anything is built).
    ModelDirNotWritableError: the model dir cannot be created.
    MemoryPlanError: the tables would not fit (unless skip_memory_check).
  """

  def __init__(
    self,
    model_dir: str,
    source: Any,
    model: Callable[..., keras.Model],
    strategy: tf.distribute.Strategy | None = None,
    eval_source: Any | None = None,
    settings: TrainSettings | None = None,
    *,
    lookup_only: bool = False,
  ):
    self.settings = settings if settings is not None else TrainSettings()
    self.lookup_only = lookup_only
    self.model_dir = model_dir
    self.strategy = strategy or tf.distribute.get_strategy()
    self.source, self.eval_source = data_sources.run_sources(
      source,
      eval_source,
      self.settings.feature_config,
      self.settings.embedding,
    )
    settings_lib.check(
      self.settings, self.source, self.eval_source, self.strategy
    )
    # ParameterServerStrategy: this process coordinates; steps and
    # per-worker datasets run on the workers (recsys.training.coordinated).
    self.coordinator = (
      strategy_lib.make_coordinator(self.strategy)
      if hardware.is_parameter_server(self.strategy)
      else None
    )
    self._make_folder()
    keras.utils.set_random_seed(self.settings.seed)
    self.memory = memory_peaks.PeakMemory()  # each phase's peak RSS
    with self.memory.phase("init"):
      self._build_embedding()
      self._build_model(model)
      self._build_checkpoints()
    with self.memory.phase("restore"):
      self.restored_step = self._restore()

  def _restore(self) -> int:
    """Restores the newest checkpoint (0: none); one written by other
    settings is refused naming them (`run_checks.explain_mismatch`)."""
    from backends import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top

    try:
      return self.checkpoints.restore()
    except ckpt_lib.CheckpointMismatchError as e:
      raise self.run_dir.explain_mismatch(e, gin.operative_config_str()) from e

  # -- construction steps ----------------------------------------------------

  def _make_folder(self) -> None:
    """Creates the model dir (refusing a file of that name); with
    summaries on (their writers write at once) it must be writable."""
    model_dir = self.model_dir
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
      raise TrainerConfigError(
        f"model_dir {model_dir!r} is a file; it must be a folder (new or "
        "holding a run to resume)."
      )
    if self.settings.summaries:
      run_dir_lib.RunDir(model_dir).check_writable()
    try:
      os.makedirs(model_dir, exist_ok=True)
    except PermissionError as e:
      raise run_dir_lib.ModelDirNotWritableError(
        f"model dir {model_dir!r} cannot be created ({e.strerror}): pass a "
        "--model_dir in a folder this user may write."
      ) from e

  def _build_embedding(self) -> None:
    """Tables, embedding optimizer, step counter and the embedding backend."""
    st, source = self.settings, self.source
    feature_config = (
      dict(source.feature_config)
      if isinstance(source, DatasetSource)
      else features_lib.feature_config(
        source.feature_specs, st.embedding, seed=st.seed
      )
    )
    features_lib.check_embedding_optimizer(
      st.embedding_optimizer, "train.embedding_optimizer"
    )
    embedding_optimizer = st.embedding_optimizer
    if embedding_optimizer is None:
      embedding_optimizer = default_embedding_optimizer()
    with self.strategy.scope():
      self.global_step = tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name="global_step",
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
      )
    # On copies: the caller's optimizers and tables keep their schedules.
    self.embedding_optimizer, self.feature_config = schedules.bind_to_step(
      embedding_optimizer, feature_config, self.global_step
    )
    (
      self.backend_name,
      self.backend_reason,
      self.compile_plan,
      self.backend,
    ) = backend_lib.make_backend(
      st,
      source,
      self.strategy,
      self.feature_config,
      self.embedding_optimizer,
      lookup_only=self.lookup_only,
    )

  def _build_model(self, model: Callable[..., keras.Model]) -> None:
    """Tables, model, dense optimizer and RNG in scope; evaluation hooks."""
    dense_optimizer = self.settings.dense_optimizer or keras.optimizers.Adam
    with self.strategy.scope():
      self.backend.build()
      self.model = model(**model_args.model_kwargs(model, self.source))
      self.model.create_variables(features_lib.dims(self.feature_config))
      check_tables = getattr(self.model, "check_tables", None)
      if callable(check_tables):  # a model that needs particular tables
        check_tables(self.feature_config, self.embedding_optimizer)
      check_no_float16(self.model)
      self.dense_optimizer = dense_optimizer()
      self.dense_optimizer.build(self.model.trainable_variables)
      # Randomness drawn during training comes from this generator, saved
      # with the run so a resumed run continues its stream (the built-in
      # models and data draw none: they are functions of the seed and the
      # step).
      self.rng = tf.random.Generator.from_seed(self.settings.seed)
    self.evaluation: hooks_lib.EvaluationHooks = self.model.evaluation_hooks(
      hooks_lib.EvaluationContext(
        self.source,
        self.eval_source,
        self.eval_batch_size,
        compile_tower=functools.partial(embed_fn, self.backend),
      )
    )
    if self.settings.exclude_seen and not self.is_retrieval:
      raise TrainerConfigError(
        "train.exclude_seen = True applies to retrieval models; "
        f"{type(self.model).__name__} is a ranking model (it scores given "
        "pairs, it ranks no corpus): leave exclude_seen off."
      )

  def _build_checkpoints(self) -> None:
    """The run folder and checkpoints (the chief's, or a worker's scratch)."""
    # Only the chief writes the run's files; the other workers of a
    # multi-worker run save to a scratch folder (`checkpoints`).
    self.chief = strategy_lib.is_chief(self.strategy)
    resolver = getattr(self.strategy, "cluster_resolver", None)
    self.run_dir = run_dir_lib.RunDir(
      self.model_dir,
      chief=self.chief,
      task=None
      if self.chief or resolver is None
      else (resolver.task_type, resolver.task_id),
    )
    self.checkpoints = checkpoints_lib.RunCheckpoints(
      self.run_dir,
      {
        "model": self.model,
        "embedding": self.backend,
        "optimizer": self.dense_optimizer,
        "step": self.global_step,
        "rng": self.rng,
      },
      self.global_step,
      self.backend,
      max_to_keep=self.settings.max_checkpoints,
    )

  # -- what the run is -------------------------------------------------------

  @property
  def eval_batch_size(self) -> int:
    """Examples per evaluation batch (`eval_batch_size`, or the global
    batch size when None)."""
    return settings_lib.eval_batch_size(self.settings)

  @property
  def is_retrieval(self) -> bool:
    """Whether the model is a retrieval model (it indexes a corpus)."""
    return self.evaluation.ranks_corpus

  def index_corpus(self) -> int:
    """Embeds the whole candidate corpus into the model's index (retrieval;
    the model's evaluation hooks do it).

    Returns:
      The number of candidates indexed (0: the model ranks no corpus).
    """
    return self.evaluation.index_corpus()

  def seen_items(self) -> seen_lib.SeenItems:
    """Each user's candidates in the training split (read once, then kept;
    a retrieval model's, through its evaluation hooks)."""
    return self.evaluation.seen_items()

  # -- data ----------------------------------------------------------------

  def distribute(
    self,
    source: Any,
    global_batch: int,
    training: bool,
    skip_steps: int = 0,
    take_steps: int | None = None,
    transform: hooks_lib.BatchTransform | None = None,
  ) -> Any:
    """A distributed dataset of `source` (`recsys.run.input`), preprocessed
    by the backend; with `transform`, each batch's features are transformed
    first (evaluation: the model's `batch_transform`, e.g. seen items)."""
    preprocess = functools.partial(
      input_lib.preprocess, self.backend, list(self.feature_config)
    )
    if transform is not None:
      preprocess = functools.partial(_transformed_first, transform, preprocess)
    # The splits differ only in where they start or stop.
    split: Callable[..., Any] = functools.partial(
      input_lib.training_input, skip_steps=skip_steps
    )
    if not training:
      split = functools.partial(input_lib.eval_input, take_steps=take_steps)
    return split(
      self.strategy,
      source,
      global_batch,
      preprocess,
      options=self.backend.input_options(),
      coordinator=self.coordinator,
    )

  # -- the run's settings and files ------------------------------------------

  def input_fingerprints(self, eval_only: bool = False) -> dict[str, Any]:
    """Fingerprints of the files the sources read (`run_inputs`)."""
    sources = (
      [self.eval_source] if eval_only else [self.source, self.eval_source]
    )
    return run_inputs.fingerprints(p for s in sources for p in s.input_files())

  def check_restored(
    self, command: str, other_data: bool = False
  ) -> run_checks.RunChanges:
    """Before `command` ("evaluate", "export") uses the restored checkpoint:
    the settings and input files are the run's (`run_checks`).

    Args:
      command: what is about to use the checkpoint.
      other_data: data settings and files may differ (an evaluation on
        other data on purpose).

    Returns:
      Every difference from the run (allowed: `train.allow_changed_settings`,
      or data ones with `other_data`); the caller records them.

    Raises:
      ChangedSettingsError: something differs that is not allowed.
    """
    return self.run_dir.check(
      command,
      gin.operative_config_str(),
      self.input_fingerprints(),
      self.restored_step,
      bool(self.settings.allow_changed_settings),
      other_data=other_data,
    )

  def require_checkpoint(self, command: str) -> int:
    """The restored step, for a command that needs one ("evaluate",
    "export").

    Raises:
      FileNotFoundError: the model dir holds no checkpoint.
    """
    if not self.restored_step:
      raise FileNotFoundError(
        f"no checkpoint in {self.model_dir!r}/checkpoints to {command}; "
        "train first (recsys train ... --model_dir) or point --model_dir at "
        "a run."
      )
    return self.restored_step
