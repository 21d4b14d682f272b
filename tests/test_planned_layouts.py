"""The plan's layouts are what the built backend holds.

For every backend that runs on 2 CPU replicas and every shipped experiment
(and the row-sharding override), `make_backend` plans the tables and
builds the backend from the plan: `plan.layouts()` must equal
`backend.layouts()`, table by table (issue 53). Cheap: the backends are
constructed, never built or trained.
"""

import glob
import os
import types

import gin
import pytest

import backends
from recsys import config, planning
from recsys.run import configured, embedding_backend
from recsys.testing import movielens as movielens_files
from recsys.train_settings import TrainSettings
from tests.conftest import mirrored_strategy
from tests.test_experiments import required_macros

EXPERIMENTS = config.EXPERIMENTS_DIR
DEFAULT = os.path.join(EXPERIMENTS, "synthetic_dlrm.gin")
CASES = {
  os.path.relpath(path, EXPERIMENTS): [path]
  for path in sorted(glob.glob(os.path.join(EXPERIMENTS, "*.gin")))
  if not path.endswith("base.gin")  # trainer defaults, no tables
}
CASES["synthetic_dlrm.gin+hardware/local_cluster_row_sharded.gin"] = [
  DEFAULT,
  os.path.join(EXPERIMENTS, "hardware", "local_cluster_row_sharded.gin"),
]


@pytest.fixture(scope="module")
def movielens_dir(tmp_path_factory):
  """A small MovieLens-like folder for the experiments that read one."""
  folder = str(tmp_path_factory.mktemp("movielens"))
  return movielens_files.write_ml100k_like(
    folder, num_users=40, num_items=60, num_ratings=600
  )


def _configured(files, movielens_dir=None):
  """The experiment's tables, optimizer, specs and placement settings."""
  bindings = [
    f"{n} = {movielens_dir!r}"
    if n == "MOVIELENS_DIR" and movielens_dir
    else f"{n} = '/nonexistent/{n.lower()}'"
    for n in required_macros(files)
  ]
  config.parse(files, bindings, finalize=False)
  specs = configured.configured_feature_specs()
  feature_config, optimizer, _, _ = configured.configured_embedding(None, specs)
  batch = config.value("train.global_batch_size") or 64
  settings = dict(
    placement=config.value("train.placement"),
    backend_options=config.value("train.backend_options"),
    global_batch_size=batch,
    skip_memory_check=True,  # full-size tables: planned, never allocated
  )
  return feature_config, optimizer, specs[0], settings


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_built_backend_holds_the_planned_layouts(case, movielens_dir):
  strategy = mirrored_strategy(2)
  try:
    feature_config, optimizer, specs, settings = _configured(
      CASES[case], movielens_dir
    )
    if feature_config is None:
      pytest.skip(f"{case}: its tables come from data files not here")
    names = backends.available(strategy)
    assert "tensorcore" in names
    for name in names:
      st = TrainSettings(backend=name, **settings)
      source = types.SimpleNamespace(feature_specs=specs)
      got, _, _, backend = embedding_backend.make_backend(
        st, source, strategy, feature_config, optimizer
      )
      widths = embedding_backend.bag_widths(specs)
      plan = embedding_backend.plan_tables(
        st, strategy, feature_config, optimizer, got, widths
      )
      assert plan.layouts() == backend.layouts(), (case, name)
      # `recsys info`'s columns say the same as the layouts.
      for row in plan.rows:
        held = backend.layouts()[row.table]
        assert row.dtype == str(held.dtype), (case, name, row.table)
        assert row.row_sharded == held.row_sharded, (case, name, row.table)
        assert row.exchange == (held.exchange and held.exchange.value)
  finally:
    gin.clear_config()


def test_row_sharding_override_plans_row_sharded_layouts():
  """The case above is not vacuous: the override's tables are row-sharded
  on 2 replicas, in the plan and in the backend."""
  strategy = mirrored_strategy(2)
  files = CASES["synthetic_dlrm.gin+hardware/local_cluster_row_sharded.gin"]
  try:
    feature_config, optimizer, specs, settings = _configured(files)
    st = TrainSettings(backend="tensorcore", **settings)
    source = types.SimpleNamespace(feature_specs=specs)
    *_, backend = embedding_backend.make_backend(
      st, source, strategy, feature_config, optimizer
    )
  finally:
    gin.clear_config()
  held = backend.layouts()
  assert held and all(layout.row_sharded for layout in held.values())
  assert isinstance(settings["placement"], planning.EmbeddingPlacement)
