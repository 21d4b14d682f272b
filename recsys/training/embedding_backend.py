"""The embedding backend of a run, built from its settings and data source.

`make_backend` resolves `train.backend` (the one place "auto" is decided,
`backends.registry.resolve`), plans compilation (`compile.plan`), checks
`train.backend_options` and the tables' memory (`recsys.planning`) before a
table is allocated, and constructs the backend.

Example:
  >>> name, reason, plan, backend = make_backend(
  ...   settings, source, strategy, feature_config, optimizer)
"""

from typing import Any

from backends import registry
from recsys import planning
from recsys._keras import tf
from recsys.training import compile as compile_lib
from recsys.training.settings import TrainerConfigError, TrainSettings


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
  options.update(st.backend_options or {})
  if not st.skip_memory_check:  # before a table is allocated
    planning.check_fits(
      planning.plan_memory(
        feature_config,
        embedding_optimizer,
        strategy,
        backend=name,
      )
    )
  backend = backend_cls(
    feature_config,
    embedding_optimizer,
    strategy=strategy,
    **options,
  )
  return name, reason, compile_plan, backend
