"""Tests of recsys/planning.py: memory per device and the `recsys info` report.

References are the byte formulas (rows x dim x 4 bytes x (1 + slots)) and the
host's RAM read independently; TPU strategies are fakes of the hardware
feature (no TPU is reachable here).
"""

import math  # noqa: E402
import os  # noqa: E402

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import base as backends_base  # noqa: E402
from backends import placement as placement_lib  # noqa: E402
from backends import registry as backends_registry  # noqa: E402
from backends import table_plan  # noqa: E402
from recsys import planning  # noqa: E402
from tests.backends.test_selection import fake_tpu_strategy  # noqa: E402
from tests.conftest import mirrored_strategy  # noqa: E402

E = tf.tpu.experimental.embedding


def _config():
  users = E.TableConfig(23, 7, name="users")
  items = E.TableConfig(11, 11, name="items", optimizer=E.Adam(0.1))
  return {
    "user": E.FeatureConfig(users),
    "friend": E.FeatureConfig(users),
    "item": E.FeatureConfig(items),
  }


def test_replicated_tables_hold_everything_on_every_device():
  plan = planning.plan_memory(
    _config(), E.Adagrad(0.1), device_memory_bytes=10**9
  )
  assert plan.backend == "tensorcore"
  by_name = {r.table: r for r in plan.rows}
  assert sorted(by_name) == ["items", "users"]  # shared table counted once
  assert by_name["users"].slots == ("accumulators",)
  assert by_name["users"].bytes_per_device == 23 * 7 * 4 * 2
  assert by_name["items"].slots == ("momenta", "velocities")
  assert by_name["items"].bytes_per_device == 11 * 11 * 4 * 3
  assert by_name["items"].placement == "replicated"
  assert plan.bytes_per_device == 23 * 7 * 4 * 2 + 11 * 11 * 4 * 3
  assert plan.fits is True and not plan.warnings


def test_tpu_embedding_shards_rows_over_the_replicas():
  plan = planning.plan_memory(
    _config(),
    E.SGD(0.1),
    fake_tpu_strategy("V1", num_replicas=4),
    device_memory_bytes=10**9,
  )
  assert plan.backend == "tpu_embedding"
  users = next(r for r in plan.rows if r.table == "users")
  assert users.shards == 4 and users.placement == "sharded /4"
  assert users.bytes_per_device == math.ceil(23 / 4) * 7 * 4  # SGD: no slots
  replicated = planning.plan_memory(
    _config(),
    E.SGD(0.1),
    fake_tpu_strategy("V1", num_replicas=4),
    10**9,
    backend="tpu_embedding_v0",
  )
  assert (
    next(r for r in replicated.rows if r.table == "users").bytes_per_device
    == 23 * 7 * 4
  )


def test_warns_before_a_configuration_that_cannot_fit():
  need = 23 * 7 * 4 * 2 + 11 * 11 * 4 * 3
  plan = planning.plan_memory(
    _config(), E.Adagrad(0.1), device_memory_bytes=need
  )  # no headroom left
  assert plan.fits is False
  assert len(plan.warnings) == 1
  assert "largest is table 'items'" in plan.warnings[0]  # 1452 B > 1288 B
  assert "Shard the tables" in plan.warnings[0]
  assert "WARNING:" in plan.format()


def _mem_total() -> int:
  with open("/proc/meminfo", encoding="ascii") as f:
    for line in f:
      if line.startswith("MemTotal:"):
        return int(line.split()[1]) * 1024
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_cpu_memory_is_host_ram_shared_by_local_replicas():
  one = planning.plan_memory(_config(), E.Adagrad(0.1))
  assert one.device_memory_bytes == _mem_total()
  assert one.memory_source == "host RAM"
  two = planning.plan_memory(_config(), E.Adagrad(0.1), mirrored_strategy(2))
  assert two.device_memory_bytes == _mem_total() // 2
  assert "/ 2 replicas" in two.memory_source


def test_accelerator_memory_unknown_unless_given():
  plan = planning.plan_memory(
    _config(), E.Adagrad(0.1), fake_tpu_strategy("UNSUPPORTED")
  )
  assert plan.device_memory_bytes is None and plan.fits is None
  assert "TPU memory is not reported" in plan.format()


def test_describe_environment_on_cpu():
  text = planning.describe_environment(
    mirrored_strategy(2), _config(), E.Adagrad(0.1)
  )
  assert "/device:CPU:1" in text
  assert "strategy: MirroredStrategy (2 replica(s))" in text
  assert "TPU embedding feature: not a TPU" in text
  assert "embedding backend: auto -> tensorcore (MirroredStrategy on" in text
  assert "backends that can run here: serving, tensorcore" in text
  assert "embedding memory per device:" in text and "users" in text


@pytest.mark.parametrize(
  "feature,backend,expected",
  [
    (
      "V2",
      "auto",
      "embedding backend: auto -> tpu_embedding (FakeTPUStrategy, "
      "embedding_feature=V2",
    ),
    (
      "UNSUPPORTED",
      "tpu_embedding",
      "embedding backend: tpu_embedding -> "
      "tpu_embedding (forced, but cannot run here: it needs a TPU with an "
      "embedding accelerator",
    ),
  ],
)
def test_describe_environment_on_tpus(feature, backend, expected):
  text = planning.describe_environment(
    fake_tpu_strategy(feature), backend=backend
  )
  assert f"TPU embedding feature: {feature}" in text
  assert expected in text


def test_human_bytes():
  assert planning.human_bytes(512) == "512 B"
  assert planning.human_bytes(3 * 1024**3) == "3.0 GiB"


def _sizes_config():
  """'small' is 23x7 floats, 'big' 5000x11; both Adagrad (one slot)."""
  small = E.TableConfig(23, 7, name="small")
  big = E.TableConfig(5000, 11, name="big")
  return {"s": E.FeatureConfig(small), "b": E.FeatureConfig(big)}


def test_sharded_backend_replicates_small_tables_and_shards_big_ones():
  small, big = 23 * 7 * 4 * 2, 5000 * 11 * 4 * 2  # table + accumulators
  # Budget HEADROOM x memory: big is above REPLICATE_SHARE of it, small below.
  memory = int(big / (planning.REPLICATE_SHARE * planning.HEADROOM) / 2)
  plan = planning.plan_memory(
    _sizes_config(),
    E.Adagrad(0.1),
    device_memory_bytes=memory,
    backend="parameter_servers",
    num_shards=3,
  )
  rows = {r.table: r for r in plan.rows}
  assert rows["small"].placement == "replicated"
  assert rows["small"].bytes_per_device == small
  assert rows["big"].placement == "sharded /3"
  assert rows["big"].bytes_per_device == math.ceil(5000 / 3) * 11 * 4 * 2
  text = plan.format()
  assert "small: replicated: " in text and "<= 10%" in text
  assert "big: sharded /3: " in text and "rows split over 3" in text


def test_replicated_backend_names_the_table_too_big_for_one_device():
  big = 5000 * 11 * 4 * 2
  plan = planning.plan_memory(
    _sizes_config(),
    E.Adagrad(0.1),
    device_memory_bytes=big,
    backend="tensorcore",
  )
  rows = {r.table: r for r in plan.rows}
  assert rows["big"].placement == rows["small"].placement == "replicated"
  assert rows["big"].reason == "replicated: one replica"
  assert plan.refusals == [
    "table 'big' needs 429.7 KiB per device replicated (5000 x 11, 1 "
    "slot(s)), over the per-device budget 343.8 KiB: train on several "
    "replicas with it row-sharded"
  ]
  assert plan.fits is False
  with pytest.raises(planning.MemoryPlanError, match="Table 'big' needs"):
    planning.check_fits(plan)


def test_tables_are_listed_in_numeric_order():
  config = {
    f"C{i}": E.FeatureConfig(E.TableConfig(5, 3, name=f"C{i}"))
    for i in (1, 10, 2, 26, 3)
  }
  plan = planning.plan_memory(config, E.SGD(0.1), device_memory_bytes=1 << 30)
  assert [r.table for r in plan.rows] == ["C1", "C2", "C3", "C10", "C26"]


@pytest.mark.parametrize("experiment", ["criteo_dlrm.gin", "criteo_dcn.gin"])
def test_cpu_small_fits_criteo_on_a_small_machine(tmp_path, experiment):
  """The override caps Criteo's vocabularies: under 1 GiB (it was 16 GiB)."""

  from recsys import config, features  # pylint: disable=g-import-not-at-top

  (tmp_path / "train.txt").write_text(
    "1\t" + "\t".join(["1"] * 13 + ["a"] * 26) + "\n"
  )
  config.parse(
    [
      os.path.join(config.EXPERIMENTS_DIR, experiment),
      os.path.join(config.EXPERIMENTS_DIR, "hardware", "cpu_small.gin"),
    ],
    [f"CRITEO_DIR = '{tmp_path}'"],
  )
  source = config.value("train.data")
  settings = config.value("train.embedding")
  optimizer = config.value("train.embedding_optimizer")
  plan = planning.plan_memory(
    features.feature_config(source.feature_specs, settings),
    optimizer,
    device_memory_bytes=4 << 30,
  )
  assert max(r.vocabulary_size for r in plan.rows) == 50_000
  assert plan.bytes_per_device < 1 << 30 and plan.fits


def test_train_refuses_tables_larger_than_the_host_naming_them(tmp_path):
  """A 10^10-row table: refused before anything is allocated."""
  import functools  # pylint: disable=g-import-not-at-top

  from recsys.data import DataSource  # pylint: disable=g-import-not-at-top
  from recsys.feature_spec import FeatureSpec  # pylint: disable=g-import-not-at-top
  from recsys.features import EmbeddingSettings  # pylint: disable=g-import-not-at-top
  from recsys.models import DLRM  # pylint: disable=g-import-not-at-top
  from recsys.training import Trainer  # pylint: disable=g-import-not-at-top

  class HugeSource(DataSource):  # never read: refused before
    feature_specs = [
      FeatureSpec("user", 10**10),
      FeatureSpec("tags", 10**10, multi_hot=True, max_ids=3),
    ]
    num_dense = 3

    def dataset(self, *args, **kwargs):
      raise AssertionError("the trainer read data it should have refused")

  with pytest.raises(planning.MemoryPlanError) as e:
    Trainer(
      str(tmp_path),
      HugeSource(),
      functools.partial(DLRM, bottom_mlp=(7,), top_mlp=(7,)),
      embedding=EmbeddingSettings(dim=7),
      embedding_optimizer=E.Adagrad(0.1),
      global_batch_size=10,
      progress_bar=False,
      summaries=False,
    )
  message = str(e.value)
  # user and tags: 10^10 x 7 floats + one Adagrad slot = 521.5 GiB each.
  assert "user (10000000000 x 7, 1 slot(s): 521.5 GiB)" in message
  assert "tags (" in message and "--skip_memory_check" in message


def test_host_plan_predicts_the_process_peak_and_names_the_overhead():
  plan = planning.plan_memory(_config(), E.Adagrad(0.1))
  fixed = planning.RUNTIME_BYTES + planning.LOOP_BYTES
  assert plan.fixed_overhead_bytes == fixed
  assert plan.predicted_peak_rss_bytes == plan.bytes_per_device + fixed
  text = plan.format()
  assert "predicted peak RSS of a training process" in text
  assert "fixed overhead " + planning.human_bytes(fixed) in text
  assert "TF runtime" in text


def test_accelerator_plan_predicts_no_host_peak():
  plan = planning.plan_memory(
    _config(), E.Adagrad(0.1), fake_tpu_strategy("V1", num_replicas=4)
  )
  assert plan.predicted_peak_rss_bytes is None
  assert "predicted peak RSS" not in plan.format()


# -- tensorcore: tables placed on the replicas ---------------------------------


def _dlrm_like():
  """'small' 23x7, 'big' 5000x11, both Adagrad (one slot); 'big' also has a
  multi-hot feature of 3 ids."""
  small = E.TableConfig(23, 7, name="small")
  big = E.TableConfig(5000, 11, name="big")
  return {
    "s": E.FeatureConfig(small),
    "b": E.FeatureConfig(big),
    "tags": E.FeatureConfig(big),
  }


SMALL, BIG = 23 * 7 * 4 * 2, 5000 * 11 * 4 * 2  # table + accumulators
IDS = {"small": 6, "big": 6 * (1 + 3)}  # per replica: 6 examples


def _plan(replicas, memory, **kwargs):
  ids = planning.ids_per_step(_dlrm_like(), {"tags": 3}, 6)
  assert ids == IDS
  return planning.plan_memory(
    _dlrm_like(),
    E.Adagrad(0.1),
    mirrored_strategy(replicas) if replicas > 1 else None,
    backend="tensorcore",
    ids_per_step=ids,
    placement=planning.EmbeddingPlacement(device_memory=memory, **kwargs),
  )


def test_tensorcore_keeps_tables_replicated_while_they_fit():
  plan = _plan(2, "1GiB")
  rows = {r.table: r for r in plan.rows}
  assert plan.placements() == {"small": "replicated", "big": "replicated"}
  assert rows["big"].bytes_per_device == BIG
  assert plan.memory_source == "EmbeddingPlacement.device_memory"
  # Replicated on 2 replicas: the ids (int64) and their gradients gathered.
  assert rows["big"].exchange_bytes == 24 * (8 + 11 * 4)
  assert plan.fits and not plan.refusals


def test_tensorcore_row_shards_the_largest_tables_until_they_fit():
  # The budget (HEADROOM x memory) holds both tables only with 'big' halved.
  memory = int((SMALL + BIG / 2 + 1000) / planning.HEADROOM)
  for replicas in (2, 4):
    plan = _plan(replicas, memory)
    rows = {r.table: r for r in plan.rows}
    assert plan.placements() == {"small": "replicated", "big": "row_sharded"}
    assert rows["big"].placement == f"row_sharded /{replicas}"
    per_device = math.ceil(5000 / replicas) * 11 * 4 * 2
    assert rows["big"].bytes_per_device == per_device
    assert plan.bytes_per_device == SMALL + per_device and plan.fits
    # Ids gathered, the owners' rows for every replica's ids all-reduced,
    # the gradients gathered.
    assert rows["big"].exchange_bytes == 24 * (8 + 11 * 4 * (replicas + 1))
    assert rows["small"].exchange_bytes == 6 * (8 + 7 * 4)
    text = plan.format()
    assert "big: row_sharded /" in text and "over the budget" in text
    assert "exchange per step and replica" in text


def test_refuses_a_table_too_big_even_row_sharded_naming_it():
  plan = _plan(2, BIG / 2 / planning.HEADROOM / 2)  # half a shard fits
  assert plan.placements()["big"] == "row_sharded"
  assert plan.refusals == [
    "table 'big' needs 214.8 KiB per device even row-sharded over 2 "
    "replica(s) (5000 x 11, 1 slot(s)), over the per-device budget "
    "107.4 KiB: add replicas, shrink the vocabulary or dim, or use an "
    "optimizer with fewer slots"
  ]
  assert "REFUSED: table 'big'" in plan.format()
  with pytest.raises(planning.MemoryPlanError, match="Table 'big' needs"):
    planning.check_fits(plan)


def test_forced_placements_are_kept_and_checked():
  plan = _plan(2, "1GiB", tables={"small": "row_sharded"})
  assert plan.placements() == {"small": "row_sharded", "big": "replicated"}
  assert "forced" in next(r.reason for r in plan.rows if r.table == "small")
  # Forced replicated, 'big' does not fit: refused, with the way out.
  refused = _plan(2, BIG, tables={"big": "replicated"})
  assert refused.refusals and "place it 'row_sharded'" in refused.refusals[0]
  with pytest.raises(ValueError, match=r"unknown tables \['nope'\]"):
    _plan(2, "1GiB", tables={"nope": "row_sharded"})
  with pytest.raises(
    ValueError, match=r"EmbeddingPlacement.tables\['big'\] = 'sharded'"
  ):
    _plan(2, "1GiB", tables={"big": "sharded"})
  # Backends that place tables themselves ignore it (export on 'serving').
  tpu = planning.plan_memory(
    _dlrm_like(),
    E.SGD(0.1),
    fake_tpu_strategy("V1", num_replicas=4),
    placement=planning.EmbeddingPlacement(tables={"big": "replicated"}),
  )
  assert {r.placement for r in tpu.rows} == {"sharded /4"}


def test_one_replica_cannot_shard_and_memory_unknown_replicates():
  one = _plan(1, BIG)  # 'big' alone is over HEADROOM x BIG
  assert one.placements()["big"] == "replicated"
  assert "train on several replicas" in one.refusals[0]
  unknown = planning.plan_memory(
    _dlrm_like(),
    E.Adagrad(0.1),
    fake_tpu_strategy("UNSUPPORTED", num_replicas=4),
  )
  assert set(unknown.placements().values()) == {"replicated"}
  assert "memory is unknown" in unknown.rows[0].reason


@pytest.mark.parametrize(
  "text,expected",
  [
    ("16GiB", 16 << 30),
    ("1.5 GB", 1_500_000_000),
    ("512MiB", 512 << 20),
    (4096, 4096),
  ],
)
def test_device_memory_takes_bytes_or_sizes(text, expected):
  assert planning.EmbeddingPlacement(text).device_memory_bytes == expected


def test_placement_bindings_apply_without_train_placement():
  """`EmbeddingPlacement.tables` bound in gin, `train.placement` not: the
  plan forces those tables (it planned as if nothing were bound)."""
  import gin  # noqa: PLC0415

  from recsys import config  # noqa: PLC0415

  gin.clear_config()
  try:
    config.parse(
      [],
      [
        "EmbeddingPlacement.tables = {'small': 'row_sharded'}",
        "EmbeddingPlacement.device_memory = '1GiB'",
      ],
      finalize=False,
    )
    plan = planning.plan_memory(
      _dlrm_like(),
      E.Adagrad(0.1),
      mirrored_strategy(2),
      backend="tensorcore",
      ids_per_step=IDS,
    )
  finally:
    gin.clear_config()
  assert plan.placements() == {"small": "row_sharded", "big": "replicated"}
  assert planning.bound_placement() == planning.EmbeddingPlacement()
  # What `recsys export` binds over a training config: the defaults.
  config.parse(
    [],
    ["EmbeddingPlacement.tables = {'small': 'row_sharded'}"]
    + planning.default_placement_bindings(),
    finalize=False,
  )
  try:
    assert planning.bound_placement() == planning.EmbeddingPlacement()
  finally:
    gin.clear_config()


def test_device_memory_refuses_what_is_no_size():
  with pytest.raises(ValueError, match="'16 gigs' is not a size"):
    planning.EmbeddingPlacement("16 gigs").device_memory_bytes  # noqa: B018
  with pytest.raises(ValueError, match="must be > 0"):
    planning.EmbeddingPlacement(0).device_memory_bytes  # noqa: B018


def test_the_plan_says_which_tables_are_bfloat16():
  """Issue 52: nothing in the output said a table was bfloat16 (its bytes
  halved silently); its slots stay float32."""
  plan = planning.plan_memory(
    _config(),
    E.Adagrad(0.1),
    device_memory_bytes=10**9,
    placement=planning.EmbeddingPlacement(table_dtype={"users": "bfloat16"}),
  )
  rows = {line.split()[0]: line.split() for line in plan.format().splitlines()}
  assert rows["table"][3] == "dtype"
  assert rows["users"][3] == "bfloat16" and rows["items"][3] == "float32"
  users = next(r for r in plan.rows if r.table == "users")
  assert users.table_bytes == 23 * 7 * 2 and users.slot_bytes == 23 * 7 * 4


@pytest.mark.parametrize(
  "table_dtype, match",
  [
    (
      "bfloat",
      r"EmbeddingPlacement.table_dtype = 'bfloat'.*Did you mean 'bfloat16'",
    ),
    (
      {"users": "float64"},
      r"EmbeddingPlacement.table_dtype\['users'\] = 'float64'",
    ),
    (
      {"user": "bfloat16"},
      r"names unknown tables \['user'\].*Did you mean 'users'",
    ),
  ],
)
def test_a_table_dtype_that_cannot_be_is_refused_naming_the_setting(
  table_dtype, match
):
  """A hostile `EmbeddingPlacement.table_dtype` (its range is declared by
  form; the planner checks the dtypes and tables it names) is refused
  before any table, naming the setting and the closest valid value."""
  with pytest.raises(ValueError, match=match):
    planning.plan_memory(
      _config(),
      E.Adagrad(0.1),
      device_memory_bytes=10**9,
      placement=planning.EmbeddingPlacement(table_dtype=table_dtype),
    )


def test_info_prints_placement_bytes_and_exchange_per_table():
  text = planning.describe_environment(
    mirrored_strategy(2),
    _dlrm_like(),
    E.Adagrad(0.1),
    placement=planning.EmbeddingPlacement(tables={"big": "row_sharded"}),
    ids_per_step=IDS,
  )
  assert "exchange/step" in text
  big = next(
    line for line in text.splitlines() if line.strip().startswith("big ")
  )
  assert (
    "row_sharded /2" in big
    and planning.human_bytes(math.ceil(5000 / 2) * 11 * 4 * 2) in big
  )


def test_cpu_replicas_tables_must_fit_the_host_whatever_the_budget(
  monkeypatch,
):
  """A device budget above the host's RAM plans for the device; where the
  replicas are the host's CPUs the tables must still fit the host."""
  host = 2 * BIG  # 80% of it holds one replica's tables, not two
  monkeypatch.setattr(planning, "host_memory_bytes", lambda: host)
  plan = _plan(2, "1TiB")
  assert plan.host_ram_bytes == host and plan.host_bytes == 2 * (SMALL + BIG)
  assert plan.host_fits is False and plan.fits is False
  assert plan.bytes_per_device < planning.HEADROOM * (1 << 40)  # the budget
  text = plan.format()
  assert "on this host: 2 replica(s) x " in text
  assert "REFUSED: this run's 2 replica(s) are this host's CPUs" in text
  with pytest.raises(planning.MemoryPlanError) as e:
    planning.check_fits(plan)
  message = str(e.value)
  assert planning.human_bytes(host) + " of RAM" in message
  assert "EmbeddingPlacement.device_memory = 1.0 TiB" in message
  assert "leave EmbeddingPlacement.device_memory unset" in message
  # Accelerators hold their own tables: no host check.
  tpu = planning.plan_memory(
    _dlrm_like(),
    E.Adagrad(0.1),
    fake_tpu_strategy("UNSUPPORTED", num_replicas=4),
    placement=planning.EmbeddingPlacement(device_memory="1TiB"),
  )
  assert tpu.host_ram_bytes is None and tpu.fits is True


# -- the planner asks the backend ----------------------------------------------


class _HalvingBackend(backends_base.EmbeddingBackend):
  """A third-party backend that splits every table in two, elsewhere."""

  name = "halves"
  answer_for: list[str] | None = None  # other tables: a wrong answer

  @classmethod
  def plan_tables(cls, request):
    tables = [
      table_plan.split(s, 2, f"{cls.name!r} halves every table")
      for s in request.tables
      if cls.answer_for is None or s.name in cls.answer_for
    ]
    return table_plan.BackendPlan(
      tables, tables_in_process=False, advice="buy more halves"
    )


@pytest.fixture
def halving_backend(monkeypatch):
  """`_HalvingBackend` registered as 'halves' (as an entry point would)."""

  class EntryPoint:
    name = "halves"

    @staticmethod
    def load():
      return _HalvingBackend

  monkeypatch.setattr(
    backends_registry, "_entry_points", lambda: {"halves": EntryPoint}
  )
  return _HalvingBackend


def test_the_plan_is_the_backends_answer(halving_backend):
  """No rule in the planner: a backend it has never heard of places the
  tables, and the report, the host check and the refusal follow it."""
  plan = planning.plan_memory(
    _config(), E.Adagrad(0.1), backend="halves", device_memory_bytes=10**9
  )
  rows = {r.table: r for r in plan.rows}
  assert rows["users"].placement == "sharded /2"
  assert rows["users"].bytes_per_device == math.ceil(23 / 2) * 7 * 4 * 2
  assert rows["items"].bytes_per_device == math.ceil(11 / 2) * 11 * 4 * 3
  assert "every table: sharded /2: 'halves' halves every table" in (
    plan.format()
  )
  # The tables are not in this process: no host-RAM check, no RSS forecast.
  assert plan.host_ram_bytes is None and plan.predicted_peak_rss_bytes is None
  small = planning.plan_memory(
    _config(), E.Adagrad(0.1), backend="halves", device_memory_bytes=100
  )
  with pytest.raises(planning.MemoryPlanError, match="or buy more halves;"):
    planning.check_fits(small)


def test_an_answer_about_other_tables_is_refused(halving_backend):
  halving_backend.answer_for = ["users"]
  try:
    with pytest.raises(
      table_plan.PlanAnswerError,
      match=r"'halves' backend's plan_tables answered for tables \['users'\]",
    ):
      planning.plan_memory(_config(), E.Adagrad(0.1), backend="halves")
  finally:
    halving_backend.answer_for = None


@pytest.mark.parametrize(
  "row_layout, exchange, want",
  [
    (
      None,
      "auto",
      "all_gather",
    ),  # contiguous: an ascending fill crowds shard 0
    ("strided", "auto", "all_to_all"),  # strided spreads it
    (None, "all_to_all", "all_to_all"),  # asked for: kept
  ],
)
def test_a_filling_dynamic_table_takes_an_exchange_that_cannot_overflow(
  row_layout, exchange, want
):
  """A dynamic table's index hands out rows in ascending order: under the
  contiguous layout a step's ids crowd the first shard while it fills (an
  overflowing all-to-all, seen on 2 workers), so "auto" gives it the
  all-gather; a hashed or static table keeps the planner's choice, and so
  does a dynamic table whose index shards split its rows as the replicas
  do (`spread`: 2 shards on 2 replicas; 4,096 rows, even shards), its ids
  then spread over the owners by their hash; 3 shards on 2 replicas do
  not (`uneven`: one crosses the owners' bound)."""
  from backends.vocabulary import DynamicVocabulary, HashedIds

  big = {
    name: E.FeatureConfig(E.TableConfig(4096, 8, name=name))
    for name in ("static", "hashed", "dynamic", "spread", "uneven")
  }
  plan = planning.plan_memory(
    big,
    E.SGD(0.1),
    mirrored_strategy(2),
    device_memory_bytes=10**9,
    placement=planning.EmbeddingPlacement(
      tables="row_sharded",
      row_layout=row_layout,
      exchange=exchange,
      vocabularies={
        "hashed": HashedIds(),
        "dynamic": DynamicVocabulary(),
        "spread": DynamicVocabulary(shards=2),
        "uneven": DynamicVocabulary(shards=3),
      },
    ),
    ids_per_step={name: 512 for name in big},
  )
  rows = {r.table: r for r in plan.rows}
  assert rows["dynamic"].exchange == rows["uneven"].exchange == want
  assert rows["static"].exchange == rows["hashed"].exchange == "all_to_all"
  assert rows["spread"].exchange == "all_to_all"
  # The plan says why, and what keeps the all-to-all, for those it crowds.
  hint = [line for line in plan.format().splitlines() if "their index" in line]
  if want == "all_gather":
    assert hint == [
      "dynamic, uneven: all-gather, their index filling the first rows "
      "first; DynamicVocabulary.shards = 2 (the rows divisible by it) "
      "spreads their ids over the replicas and keeps the all-to-all"
    ], plan.format()
  else:
    assert hint == [], plan.format()


@pytest.mark.parametrize(
  "bounds, rows, replicas, even",
  [
    ([0, 2048, 4096], 4096, 2, True),
    ([0, 1024, 2048, 3072, 4096], 4096, 2, True),  # two shards an owner
    ([0, 1365, 2730, 4096], 4096, 2, False),  # the middle one crosses
    ([0, 2047, 4095], 4096, 2, False),  # 4,095 id rows: off by one
    ([0, 3, 6, 9, 10], 10, 2, False),  # owners of 5 rows: 3 | 5 crosses
    ([0, 2, 4, 6, 8, 10], 10, 5, True),
    ([0, 0, 4], 4, 2, False),  # an empty shard
    ([0, 7], 7, 1, True),  # one replica: nothing to spread
  ],
)
def test_index_shards_spread_evenly_only_within_one_owner_each(
  bounds, rows, replicas, even
):
  assert placement_lib.spreads_evenly(bounds, rows, replicas) is even
  offsets = placement_lib.contiguous_offsets(rows, replicas)
  assert (
    offsets[0] == 0 and offsets[-1] == rows and len(offsets) == replicas + 1
  )


def test_parameter_servers_take_dynamic_tables_and_the_plan_says_where():
  """The parameter_servers backend maps raw ids (its index on the first
  server, for every worker): the layout carries the vocabulary and the
  plan names where the index lives. TF's V0 takes it too; TPUEmbedding
  (V1, V2), which cannot reset a row, only vocabularies that never reuse
  one, the others refused naming the table, each setting and the
  backends that take them."""
  from backends.vocabulary import DynamicVocabulary, HashedIds

  policy = DynamicVocabulary(eviction="lfu", shards=4)
  placement = planning.EmbeddingPlacement(vocabularies={"big": policy})
  plan = planning.plan_memory(
    _sizes_config(),
    E.Adagrad(0.1),
    device_memory_bytes=10**9,
    backend="parameter_servers",
    num_shards=2,
    placement=placement,
  )
  rows = {r.table: r for r in plan.rows}
  assert rows["big"].layout.vocabulary == policy
  assert rows["small"].layout.vocabulary is None
  assert plan.index_bytes == policy.index_bytes(rows["big"].vocabulary_size)
  text = plan.format()
  assert "big dynamic (lfu eviction, index in 4 shards," in text
  assert "on the parameter servers, for every worker (a whole " in text
  v0 = planning.plan_memory(
    _sizes_config(),
    E.Adagrad(0.1),
    device_memory_bytes=10**9,
    backend="tpu_embedding_v0",
    placement=placement,
  )
  assert {r.table: r.layout.vocabulary for r in v0.rows}["big"] == policy
  with pytest.raises(
    planning.PlacementSettingsError,
    match=r"table 'big': DynamicVocabulary eviction = 'lfu' \(needs 'none'\) "
    r"and unknown = 'zeros' \(needs 'unknown_row'\) cannot run on the "
    r"'tpu_embedding' backend.*'tensorcore' or 'tpu_embedding_v0'",
  ):
    planning.plan_memory(
      _sizes_config(),
      E.Adagrad(0.1),
      device_memory_bytes=10**9,
      backend="tpu_embedding",
      placement=placement,
    )
  never_reused = DynamicVocabulary(eviction="none", unknown="unknown_row")
  for kept in (never_reused, HashedIds()):
    v1 = planning.plan_memory(
      _sizes_config(),
      E.Adagrad(0.1),
      device_memory_bytes=10**9,
      backend="tpu_embedding",
      placement=planning.EmbeddingPlacement(vocabularies={"big": kept}),
    )
    assert {r.table: r.layout.vocabulary for r in v1.rows}["big"] == kept


def test_the_plan_counts_a_processs_share_of_index_shards():
  """Worker processes hold a sharded index apart (shard s on process s
  mod W): a process's indices are its share, and the plan says so."""
  import dataclasses

  from backends.vocabulary import DynamicVocabulary

  policy = DynamicVocabulary(shards=4)
  plan = planning.plan_memory(
    _sizes_config(),
    E.Adagrad(0.1),
    device_memory_bytes=10**9,
    backend="tensorcore",
    placement=planning.EmbeddingPlacement(vocabularies={"big": policy}),
  )
  rows = {r.table: r for r in plan.rows}
  size = rows["big"].vocabulary_size
  assert plan.worker_processes == 1
  assert plan.index_bytes == policy.index_bytes(size)
  two = dataclasses.replace(plan, worker_processes=2)
  assert two.index_bytes == policy.process_bytes(size, 2) < plan.index_bytes
  assert "its share of the shards the 2 processes hold apart" in two.format()
  assert "hold apart" not in plan.format()
