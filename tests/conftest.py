"""Shared test set-up: Keras 2, eight logical CPUs, clean gin state per test.

Eight logical CPU devices are configured before TensorFlow initialises its
runtime so that tests can build MirroredStrategy over 2, 4 or 8 replicas.
"""

import collections
import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
#: RECSYS_TEST_TF_DEFAULTS=1: the tests run with TF's defaults, which the
#: suite otherwise changes for speed (docs/testing.md, "Suite time"): oneDNN,
#: grappler and XLA's LLVM passes. Each keeps a graph's results; each costs
#: tiny test graphs that run a few times more than it saves them.
TF_DEFAULTS = os.environ.get("RECSYS_TEST_TF_DEFAULTS", "0") == "1"
if not TF_DEFAULTS:
  # TF's own (Eigen) CPU kernels, here and in the processes tests start:
  # oneDNN's per-op set-up cost a tiny Trainer run ~12-15 % more CPU.
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  # XLA's LLVM backend without its optimization passes, here and in the
  # processes tests start (unless XLA_FLAGS is set): ~15 % of the compiled
  # tests' CPU; the arithmetic is the same (no fast-math either way).
  os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

#: A folder on the PYTHONPATH of the processes tests start: its
#: sitecustomize turns grappler off in them, as below for this process.
CHILD_SITE = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "child_site"
)


def without_child_site(env: dict) -> dict:
  """`env` whose PYTHONPATH leaves CHILD_SITE out: a process with TF's
  defaults, as a user runs it."""
  parts = env.get("PYTHONPATH", "").split(os.pathsep)
  kept = os.pathsep.join(p for p in parts if p and p != CHILD_SITE)
  return {k: v for k, v in env.items() if k != "PYTHONPATH"} | (
    {"PYTHONPATH": kept} if kept else {}
  )


if not TF_DEFAULTS:
  os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [CHILD_SITE, os.environ.get("PYTHONPATH")])
  )

import gin  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TF)
from recsys import _tf_internal  # noqa: E402
from tests import report_failures  # noqa: E402

NUM_LOGICAL_CPUS = 8

# What the imports made lives as long as the worker: keep it out of the
# garbage collector's full passes (tests/models in one process: 8.6 -> 6.8 s
# of its 171 CPU-seconds spent collecting). Tracing makes objects by the
# hundred thousand, most of them kept: collect every 20,000 allocations, not
# every 700 (tests/models and the tensorcore training tests: 7.3 -> 2.1 s of
# ~125 CPU-seconds in 115 collections instead of 4,885).
gc.freeze()
gc.set_threshold(20_000, 20, 50)

# Grappler (TF's graph optimizer) off in the test processes (~11 % of the
# in-process tests' CPU), and in the processes they start (CHILD_SITE) but
# the few that check what a user runs with TF's defaults.
if not TF_DEFAULTS:
  tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
  _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)


@pytest.hookimpl(trylast=True)  # after the terminal reporter is made
def pytest_configure(config):
  """A failing test's name, printed when it fails (`tests/report_failures`):
  a run stopped before its summary still names it."""
  report_failures.pytest_configure(config)


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture(scope="session")
def serving_process(tmp_path_factory):
  """The session's serving process (`tests/serving_process.py`): TensorFlow
  without the project, started once for every test file that serves an
  export from it."""
  from tests.serving_process import ServingProcess  # noqa: PLC0415

  serving = ServingProcess(tmp_path_factory.mktemp("serving"))
  yield serving
  serving.close()


_STRATEGIES = {}


def mirrored_strategy(num_replicas: int) -> tf.distribute.MirroredStrategy:
  """A MirroredStrategy over `num_replicas` logical CPUs (one per size).

  Tests share one strategy per size: building one traces nothing, but each
  test's functions would be traced again for a new one. Its collective keys
  are its own (`recsys._tf_internal.mirrored_strategy`), as are those of the
  strategies the Trainer builds.
  """
  cpus = tf.config.list_logical_devices("CPU")
  if len(cpus) < num_replicas:
    pytest.skip(
      f"needs {num_replicas} logical CPUs, TF runtime has {len(cpus)}"
    )
  if num_replicas not in _STRATEGIES:
    _STRATEGIES[num_replicas] = _tf_internal.mirrored_strategy(
      [d.name for d in cpus[:num_replicas]]
    )
  return _STRATEGIES[num_replicas]


@pytest.fixture(params=[1, 2], ids=["1replica", "2replicas"])
def strategy(request):
  """The default strategy, then a 2-replica MirroredStrategy."""
  if request.param == 1:
    return tf.distribute.get_strategy()
  return mirrored_strategy(request.param)


def pytest_collection_modifyitems(items):
  """Test files in order of their estimated cost, largest first.

  `make test` hands whole files to two workers in collection order; a long
  file handed out last leaves the other worker idle at the end. Largest
  first (slow tests take ~10 s and more, the others ~0.15 s) keeps the two
  busy to the end; the Makefile turns off xdist's own order (by number of
  tests), which handed the few-test cluster and benchmark files out last.
  Tests keep their order inside a file.
  """
  cost: collections.Counter = collections.Counter()
  for item in items:
    cost[item.path] += 10.0 if item.get_closest_marker("slow") else 0.15
  items.sort(key=lambda item: -cost[item.path])
