"""The embedding backend of a run, built from its settings and data source.

`make_backend` resolves `train.backend` once (the one place "auto" is
decided, `backends.registry.resolve`), plans compilation (`compile.plan`),
checks `train.backend_options` (which take no table layout: that is
`EmbeddingPlacement`'s), plans the tables' memory and layouts
(`plan_tables`, `recsys.planning`: logged at start, refused before a table
is allocated when it does not fit) and constructs the backend from the
plan's layouts (`plan.layouts()`): the plan `recsys info` prints is what
the backend holds (`backend.layouts()`).

Example:
  >>> name, reason, plan, backend = make_backend(
  ...   settings, source, strategy, feature_config, optimizer)
"""

import logging
from typing import Any

from backends import registry
from backends.layout import TableLayout
from recsys import features as features_lib
from recsys import planning
from recsys._keras import tf
from recsys.process import console
from recsys.run import compile as compile_lib
from recsys.train_settings import TrainerConfigError, TrainSettings

log = logging.getLogger("recsys.training")


def bag_widths(feature_specs: Any) -> dict[str, int | None]:
  """Each multi-hot feature's longest bag (None: unbounded), from the data
  source's specs: static widths give compiled steps fixed shapes (and
  replicas a fixed-size exchange of touched rows)."""
  return {
    spec.name: spec.max_ids
    for spec in feature_specs
    if spec.multi_hot and not spec.sequence_length
  }


def check_backend_options(name: str, options: Any) -> None:
  """`train.backend_options` against what backend `name` declares.

  Raises:
    planning.PlacementSettingsError: a table's layout among the options
      (naming its home in `EmbeddingPlacement`).
    TrainerConfigError: an option the backend does not take, naming them.
  """
  planning.refuse_layout_options(options)
  try:
    registry.check_options(name, options or {})
  except registry.UnknownBackendOptionError as e:
    raise TrainerConfigError(f"train.backend_options {e}") from e


def plan_tables(
  st: TrainSettings,
  strategy: tf.distribute.Strategy,
  feature_config: dict[str, Any],
  embedding_optimizer: Any,
  name: str,
  widths: dict[str, int | None],
) -> planning.MemoryPlan:
  """The tables' memory plan and placement on backend `name`, checked.

  The one source of where each table lives: `recsys info` prints this plan
  and `make_backend` builds the backend from its layouts (`train.placement`,
  an `EmbeddingPlacement`, requests them).

  Raises:
    TrainerConfigError: an unknown backend option.
    planning.PlacementSettingsError: a placement setting that cannot be.
  """
  check_backend_options(name, st.backend_options)
  per_replica = int(st.global_batch_size) // strategy.num_replicas_in_sync
  return planning.plan_memory(
    feature_config,
    embedding_optimizer,
    strategy,
    backend=name,
    placement=st.placement,
    backend_options=st.backend_options,
    ids_per_step=planning.ids_per_step(feature_config, widths, per_replica),
  )


def check_raw_ids_are_mapped(specs: Any, layouts: dict[str, Any]) -> None:
  """Refuses a feature that delivers raw ids (`FeatureSpec.raw_ids`) into
  a table that takes them as rows: they would be refused as out of range
  at the first step, or (below the vocabulary size by chance) read
  unrelated rows silently.

  Raises:
    planning.PlacementSettingsError: naming the features and tables, and
      the two ways to map their ids.
  """
  unmapped = {
    spec.name: features_lib.table_name(spec)
    for spec in specs
    if getattr(spec, "raw_ids", False)
    and not layouts.get(features_lib.table_name(spec), TableLayout()).dynamic
  }
  if not unmapped:
    return
  tables = sorted(set(unmapped.values()))
  example = ", ".join(f'"{t}": @DynamicVocabulary()' for t in tables)
  raise planning.PlacementSettingsError(
    f"features {sorted(unmapped)} deliver raw ids (FeatureSpec.raw_ids), "
    f"but their tables {tables} take ids as rows. Map them: "
    f"EmbeddingPlacement.vocabularies = {{{example}}} (a dynamic "
    "vocabulary), or @HashedIds() instead of @DynamicVocabulary() to hash "
    "them into the rows."
  )


def make_backend(
  st: TrainSettings,
  source: Any,
  strategy: tf.distribute.Strategy,
  feature_config: dict[str, Any],
  embedding_optimizer: Any,
  lookup_only: bool = False,
) -> tuple[str, str, compile_lib.CompilePlan, Any]:
  """`(name, reason, compile plan, backend)` for the run's tables;
  `lookup_only`: restored to be evaluated or exported (`restore_only` for
  a backend that declares it)."""
  name, reason = registry.resolve(st.backend, strategy)
  # `resolve` logs the choice and its reason (the one place "auto" is
  # decided); construct the resolved class directly so it is not re-resolved.
  options: dict[str, Any] = {"bag_widths": bag_widths(source.feature_specs)}
  compile_plan = compile_lib.plan(strategy, st.jit_compile)
  backend_cls = registry.get(name)
  if compile_plan.static_shapes:
    options.update(registry.declared_options(name, {"static_shapes": True}))
  plan = plan_tables(
    st,
    strategy,
    feature_config,
    embedding_optimizer,
    name,
    options["bag_widths"],
  )
  # What a training run builds; a backend that only serves (the export's)
  # holds the tables without their slots, so its plan says little.
  log.log(
    logging.INFO if backend_cls.capabilities.trains else logging.DEBUG,
    "embedding backend %s (%s); its tables:\n%s",
    name,
    reason if st.backend == name else f"{st.backend}: {reason}",
    plan.format(),
    extra=console.shown_as(console.PLAN),
  )
  if backend_cls.capabilities.trains:  # an export maps them itself (IdMaps)
    check_raw_ids_are_mapped(source.feature_specs, plan.layouts())
  if not st.skip_memory_check:  # before a table is allocated
    planning.check_fits(plan)
  options.update(st.backend_options or {})
  if lookup_only:
    options.update(registry.declared_options(name, {"restore_only": True}))
  backend = registry.construct(
    name,
    feature_config,
    embedding_optimizer,
    strategy,
    plan.layouts(),  # as planned, for a backend built from layouts
    **options,
  )
  return name, reason, compile_plan, backend
