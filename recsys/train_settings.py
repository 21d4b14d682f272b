"""`TrainSettings`: how one run trains, declared once.

Gin's `train` (`recsys.run.configured.configured_run`) spells these
settings out as its parameters, so that gin binds and checks
`train.<name>` (and suggests a name for a misspelt one); it builds one
`TrainSettings` from its arguments, naming each
(`TrainSettings(seed=seed, ...)`), for the `RestoredRun` and the
`Trainer`, which read their settings only from there. A setting is
declared here, once, with its default, its documentation and its
metadata (`_setting`): its kind (an execution setting a resume may
change, or a math setting) and the `recsys` switch that sets it. The
lists other modules need are derived from that metadata
(`run_configs.EXECUTION_SETTINGS`, `flag_settings`); a test checks that
every field has a kind, is a `train` parameter with the same default and
reaches the Trainer. Where each goes is written out by name where it is
read: the `RestoredRun`, its `Evaluator` and the Trainer read
`settings.<name>`; the loop's timing is the settings normalized once
(`recsys.training.controller.LoopSchedule.of_settings`).

Example:
  >>> settings = TrainSettings(global_batch_size=256, train_steps=100)
  >>> trainer = Trainer("/tmp/run", SyntheticCTR(), DLRM, settings=settings)

Each setting's valid range is declared with it (`recsys.ranges`, in its
annotation) and checked when `TrainSettings` is built; the CLI checks gin
bindings against the same declarations before TensorFlow starts.
`check` checks the settings against the run's sources (data sources:
`recsys.data.sources.run_sources` wraps plain datasets first) and strategy
before anything is built (`TrainerConfigError`).
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from recsys import features as features_lib
from recsys import ranges
from recsys._keras import keras, tf
from recsys.data.pipeline import DataSource
from recsys.errors import SettingsError
from recsys.ranges import Choice, Int


class TrainerConfigError(SettingsError):
  """The trainer's settings are inconsistent (batch sizes, steps, sources)."""


#: The kinds of setting, each field's `metadata["kind"]`. An execution
#: setting changes how a run is executed or reported, not the numbers it
#: computes, so a resume may change it (`run_configs.EXECUTION_SETTINGS`);
#: a math setting changes the numbers (refused on resume unless allowed).
EXECUTION = "execution"
MATH = "math"
KINDS = (EXECUTION, MATH)

_AT_THE_END = "0: only at the end"
_WHOLE_SPLIT = "None: the whole evaluation split"


def _setting(default: Any, kind: str, *, flag: str | None = None) -> Any:
  """A `TrainSettings` field and what the other lists derive from it.

  Args:
    default: the field's default (also `train`'s, a test checks).
    kind: EXECUTION or MATH.
    flag: the `recsys` flag (a switch) that sets the setting to the
      opposite of its default, e.g. `--no_progress`.
  """
  metadata: dict[str, Any] = {"kind": kind}
  if flag is not None:
    metadata["flag"] = flag
  return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """Every setting of a run besides its objects (folder, data, model, strategy).

  Attributes:
    embedding: `EmbeddingSettings` (dim, combiner, per-table overrides).
    embedding_optimizer: default `tf.tpu.experimental.embedding` optimizer
      (None: Adagrad(0.05)).
    dense_optimizer: Keras optimizer class or factory, called in scope
      (None: Adam).
    backend: embedding backend name, or "auto" to choose from the hardware.
    backend_options: keyword arguments for the backend's constructor (e.g.
      `bag_widths`).
    global_batch_size: examples per step over all replicas.
    eval_batch_size: global eval batch (None: global_batch_size).
    train_steps: total steps (a resumed run continues up to this).
    steps_per_loop: steps per compiled host call (TPU host-loop pattern).
    eval_every: evaluate every N steps (0: only at the end).
    eval_steps: eval batches per evaluation (None: the whole eval set).
    checkpoint_every: save every N steps (0: only at the end).
    max_checkpoints: checkpoints kept in the model dir.
    seed: seeds Python, NumPy and TF (`keras.utils.set_random_seed`).
    progress_bar: show a tqdm bar with throughput and ETA (on a terminal).
    summaries: write TensorBoard summaries.
    nonfinite_policy: what a step with NaN/inf loss or gradients does:
      "stop" (raise `NonFiniteLossError` naming the step and the last good
      checkpoint; nothing is saved) or "skip" (leave the step out, count it
      in `train/nonfinite_steps`).
    jit_compile: compile each replica's step with XLA, as a TPU does (None:
      on under a TPUStrategy, off elsewhere). On several CPU replicas, whose
      collectives XLA cannot compile, the step runs uncompiled on the same
      static shapes (`recsys.run.compile.plan`).
    batch_slices: how many slices of each replica's batch the model's
      dense part runs on side by side (`recsys.training.batch_slices`; the
      same gradients, summed in another order). None: 2 on a CPU replica
      of 2 or more cores for a ranking model, 1 elsewhere.
    allow_changed_settings: resume a checkpoint although settings that
      change the math (data, model, optimizers, batch size, seed, ...)
      differ from the previous run's (refused otherwise,
      `run_configs.ChangedSettingsError`); every run's config is kept.
    skip_memory_check: build the tables even when their memory plan
      (`recsys.planning`) exceeds the host's memory (refused otherwise,
      `planning.MemoryPlanError`, naming the tables and sizes).
    exclude_seen: retrieval evaluation ranks, for each held-out pair, only
      the candidates its user did not interact with in the training split
      (never excluding the pair's own candidate), as production retrieval
      and RecBole's full ranking do; False ranks the whole corpus.
    placement: `recsys.planning.EmbeddingPlacement`: one device's memory
      and each table's layout requests (placement, row layout, exchange,
      storage dtype; the one home of them: `backend_options` refuses
      them). The planner places each table of the
      tensorcore backend replicated or row-sharded over the replicas
      (printed at start) and refuses a plan that does not fit (None:
      detected memory, nothing forced).
    feature_config: with the data an unbatched `tf.data.Dataset` of
      `(features dict, label)` (Python callers): the dict feature name ->
      `tf.tpu.experimental.embedding.FeatureConfig` to train, used as is
      (`recsys.data.from_dataset.DatasetSource`; `embedding` must be None).
  """

  embedding: features_lib.EmbeddingSettings | None = _setting(None, MATH)
  embedding_optimizer: Any | None = _setting(None, MATH)
  dense_optimizer: Callable[[], Any] | None = _setting(None, MATH)
  backend: ranges.Name = _setting("auto", EXECUTION)
  backend_options: Mapping[str, Any] | None = _setting(None, EXECUTION)
  global_batch_size: ranges.PositiveInt = _setting(1024, MATH)
  eval_batch_size: ranges.PositiveInt | None = _setting(None, EXECUTION)
  train_steps: Annotated[int, Int(0, note="0: train nothing")] = _setting(
    1000, EXECUTION
  )
  steps_per_loop: ranges.PositiveInt = _setting(100, EXECUTION)
  eval_every: Annotated[int, Int(0, note=_AT_THE_END)] = _setting(0, EXECUTION)
  eval_steps: Annotated[int | None, Int(1, note=_WHOLE_SPLIT)] = _setting(
    20, EXECUTION
  )
  checkpoint_every: Annotated[int, Int(0, note=_AT_THE_END)] = _setting(
    0, EXECUTION
  )
  max_checkpoints: ranges.PositiveInt = _setting(3, EXECUTION)
  seed: ranges.Seed = _setting(0, MATH)
  progress_bar: ranges.Flag = _setting(True, EXECUTION, flag="no_progress")
  summaries: ranges.Flag = _setting(True, EXECUTION)
  nonfinite_policy: Annotated[str, Choice(("stop", "skip"))] = _setting(
    "stop", EXECUTION
  )
  jit_compile: ranges.Flag | None = _setting(None, EXECUTION)
  batch_slices: ranges.PositiveInt | None = _setting(None, EXECUTION)
  allow_changed_settings: ranges.Flag = _setting(
    False, EXECUTION, flag="allow_changed_settings"
  )
  skip_memory_check: ranges.Flag = _setting(
    False, EXECUTION, flag="skip_memory_check"
  )
  exclude_seen: ranges.Flag = _setting(False, EXECUTION, flag="exclude_seen")
  placement: Any | None = _setting(None, EXECUTION)
  feature_config: Mapping[str, Any] | None = _setting(None, MATH)

  def __post_init__(self) -> None:
    """Each setting within its declared range (`recsys.ranges`), named as
    gin names it (`train.<name>`), before anything is built."""
    ranges.check_fields(self, "train")


def names_of_kind(kind: str) -> tuple[str, ...]:
  """The settings of one kind (EXECUTION or MATH), in declaration order."""
  fields = dataclasses.fields(TrainSettings)
  return tuple(f.name for f in fields if f.metadata.get("kind") == kind)


def eval_batch_size(settings: TrainSettings) -> int:
  """Examples per evaluation batch: `eval_batch_size`, or the global batch
  size when None (what the Trainer and the restored run evaluate with)."""
  return int(settings.eval_batch_size or settings.global_batch_size)


def flag_settings() -> dict[str, tuple[str, Any]]:
  """`{flag: (setting, value)}` of the `recsys` switches that set a setting.

  A switch given sets its setting to the opposite of the default (e.g.
  `--no_progress`: `progress_bar = False`).
  """
  return {
    f.metadata["flag"]: (f.name, not f.default)
    for f in dataclasses.fields(TrainSettings)
    if "flag" in f.metadata
  }


# -- checks --------------------------------------------------------------------


def check(
  settings: TrainSettings,
  source: Any,
  eval_source: Any,
  strategy: tf.distribute.Strategy,
) -> None:
  """Checks `settings` against the run's sources and strategy, changing none.

  Before anything is built: the batch sizes fit the replicas, both sources
  are data sources (after `recsys.data.sources.run_sources`), the dense
  optimizer is a factory.

  Raises:
    TrainerConfigError: naming the setting and what it should be.
  """
  check_batch_sizes(
    strategy,
    int(settings.global_batch_size),
    int(settings.eval_batch_size or settings.global_batch_size),
  )
  check_source(source, "train.data")
  if eval_source is not source:
    check_source(eval_source, "train.eval_data")
  check_dense_optimizer(settings.dense_optimizer)
  check_batch_slices(
    settings.batch_slices,
    int(settings.global_batch_size) // strategy.num_replicas_in_sync,
  )


def check_batch_slices(slices: int | None, replica_batch: int) -> None:
  """`batch_slices` (None, or an int >= 1 as declared) is at most the
  replica's batch."""
  if slices is not None and slices > replica_batch:
    raise TrainerConfigError(
      f"batch_slices={slices} is more than the {replica_batch} examples "
      "each replica gets per step; use at most that, or None."
    )


def check_batch_sizes(
  strategy: tf.distribute.Strategy, global_batch_size: int, eval_batch_size: int
) -> None:
  """Both batch sizes are positive multiples of the replicas in sync."""
  replicas = strategy.num_replicas_in_sync
  for name, size in (
    ("global_batch_size", global_batch_size),
    ("eval_batch_size", eval_batch_size),
  ):
    if size < 1 or size % replicas:
      raise TrainerConfigError(
        f"{name}={size} must be a positive multiple of the "
        f"{replicas} replicas in sync (per-replica batch = {name} / "
        f"{replicas})."
      )


def check_source(source: Any, where: str) -> None:
  """A data source is a `recsys.data.DataSource` (the data contract)."""
  if not isinstance(source, DataSource):
    raise TrainerConfigError(
      f"{where} is {source!r} ({type(source).__name__}); expected a data "
      "source, a recsys.data.DataSource such as @SyntheticCTR() or "
      "@CriteoTSV() (for a plain tf.data.Dataset: "
      "recsys.data.DatasetSource(dataset, feature_config))."
    )


def check_dense_optimizer(factory: Any) -> None:
  """`dense_optimizer` is a Keras optimizer class or factory, no instance."""
  if factory is None:
    return
  if isinstance(
    factory, (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)
  ):
    raise TrainerConfigError(
      f"train.dense_optimizer is an optimizer instance "
      f"({type(factory).__name__}); give the class or a factory so it is "
      "built inside the strategy's scope: in gin write "
      "@keras.optimizers.Adam without parentheses (set its arguments with "
      "keras.optimizers.Adam.learning_rate = ...)."
    )
  if not callable(factory) or getattr(factory, "__module__", "").startswith(
    "tensorflow.python.tpu"
  ):
    raise TrainerConfigError(
      f"train.dense_optimizer is {factory!r}; expected a Keras optimizer "
      "class such as @keras.optimizers.Adam (the tables' optimizer is "
      "train.embedding_optimizer)."
    )
