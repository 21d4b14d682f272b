"""The embedding backend of a run, built from its settings and data source.

`make_backend` resolves `train.backend` (the one place "auto" is decided,
`backends.registry.resolve`), plans compilation (`compile.plan`), checks
`train.backend_options`, plans the tables' memory and placement
(`recsys.planning`: logged at start, refused before a table is allocated
when it does not fit) and constructs the backend with that placement.

Example:
  >>> name, reason, plan, backend = make_backend(
  ...   settings, source, strategy, feature_config, optimizer)
"""

import logging
from typing import Any

from backends import registry
from recsys import planning
from recsys._keras import tf
from recsys.train_settings import TrainerConfigError, TrainSettings
from recsys.training import compile as compile_lib

log = logging.getLogger("recsys.training")


def make_backend(
  st: TrainSettings,
  source: Any,
  strategy: tf.distribute.Strategy,
  feature_config: dict[str, Any],
  embedding_optimizer: Any,
) -> tuple[str, str, compile_lib.CompilePlan, Any]:
  """`(name, reason, compile plan, backend)` for the run's tables."""
  name, reason = registry.resolve(st.backend, strategy)
  # `resolve` logs the choice and its reason (the one place "auto" is
  # decided); construct the resolved class directly so it is not re-resolved.
  # The data source knows its longest bags: static widths give compiled
  # steps fixed shapes (and replicas a fixed-size exchange of touched rows).
  options: dict[str, Any] = {
    "bag_widths": {
      spec.name: spec.max_ids
      for spec in source.feature_specs
      if spec.multi_hot and not spec.sequence_length
    }
  }
  compile_plan = compile_lib.plan(strategy, st.jit_compile)
  backend_cls = registry.get(name)
  if compile_plan.static_shapes and "static_shapes" in backend_cls.options:
    options["static_shapes"] = True
  try:
    registry.check_options(name, st.backend_options or {})
  except registry.UnknownBackendOptionError as e:
    raise TrainerConfigError(f"train.backend_options {e}") from e
  plan = _plan(st, strategy, feature_config, embedding_optimizer, name, options)
  if not st.skip_memory_check:  # before a table is allocated
    planning.check_fits(plan)
  if "placement" in backend_cls.options:
    options["placement"] = plan.placements()
    options["row_layout"] = (
      st.placement or planning.EmbeddingPlacement()
    ).row_layout
  options.update(st.backend_options or {})
  backend = backend_cls(
    feature_config,
    embedding_optimizer,
    strategy=strategy,
    **options,
  )
  return name, reason, compile_plan, backend


def _plan(
  st: TrainSettings,
  strategy: tf.distribute.Strategy,
  feature_config: dict[str, Any],
  embedding_optimizer: Any,
  name: str,
  options: dict[str, Any],
) -> planning.MemoryPlan:
  """The tables' memory plan and placement, logged."""
  placement = st.placement
  if placement is not None and not isinstance(
    placement, planning.EmbeddingPlacement
  ):
    raise TrainerConfigError(
      f"train.placement is {placement!r}; expected @EmbeddingPlacement() "
      "(gin) or recsys.planning.EmbeddingPlacement(...)."
    )
  per_replica = int(st.global_batch_size) // strategy.num_replicas_in_sync
  try:
    plan = planning.plan_memory(
      feature_config,
      embedding_optimizer,
      strategy,
      backend=name,
      placement=placement,
      ids_per_step=planning.ids_per_step(
        feature_config, options.get("bag_widths") or {}, per_replica
      ),
    )
  except ValueError as e:
    raise TrainerConfigError(f"train.placement: {e}") from e
  log.info("embedding tables (%s backend):\n%s", name, plan.format())
  return plan
