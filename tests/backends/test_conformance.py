"""Every registered backend against the conformance suite of its capabilities.

`backends.conformance` turns each backend's declared capabilities into
checks against NumPy (what it declares it must do, what it does not declare
it must refuse by name). Here it runs on:

* every registered backend that can run under the default strategy
  (`tensorcore`, `serving`; a third-party one installed under the
  `recsys.backends` entry points too), built as the registry builds it;
* `tensorcore` on its static-shape path (`static_shapes=True`, what a
  compiled TPU step computes) and on TF ops only (`fused_kernels=False`);
* `tensorcore` with row-sharded storage (`layouts=TableLayout("row_sharded")`)
  on both engines, and with its tables split over 2 replicas (2 logical CPUs,
  the suite's eager calls reading and updating each replica's shard);
* a backend that declares less than it inherits (a `tensorcore` subclass with
  one combiner, one optimizer, dense ids, no sequence features): every
  refusal path of the suite.

`parameter_servers` runs the suite in a subprocess that is the coordinator of an
in-process cluster (1 worker, 2 parameter servers: the tables are split);
under the default strategy it must refuse. The TPU backends (`tpu_embedding`,
`tpu_embedding_v0`) cannot run here (no TPU): they are checked for a clear
refusal (`check_unavailable`) only.
"""

import json

import pytest
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import base, conformance, registry
from backends.layout import TableLayout
from backends.tensorcore.backend import TensorCoreEmbedding
from tests.conftest import mirrored_strategy
from tests.distributed import cluster as cluster_lib

E = tf.tpu.experimental.embedding


class RestrictedBackend(TensorCoreEmbedding):
  """Declares less than tensorcore can do: the suite must see it refuse."""

  name = "restricted"
  capabilities = base.Capabilities(
    combiners=frozenset({"sum"}),
    optimizers=frozenset({E.SGD}),
    input_kinds=frozenset({"dense"}),
    sequence_features=False,
    quantization=False,
  )


def _runnable() -> dict[str, conformance.Conformance]:
  strategy = tf.distribute.get_strategy()
  suites = {}
  for name in registry.names():
    cls = registry.get(name)
    if cls.unavailable_reason(strategy) is None:
      suites[name] = conformance.Conformance(cls)
  tensorcore = TensorCoreEmbedding
  suites["tensorcore-static"] = conformance.Conformance(
    lambda config, opt: tensorcore(config, opt, static_shapes=True),
    tensorcore.capabilities,
  )
  suites["tensorcore-tf-ops"] = conformance.Conformance(
    lambda config, opt: tensorcore(config, opt, fused_kernels=False),
    tensorcore.capabilities,
  )
  for name, options in {
    "tensorcore-row-sharded": {},
    "tensorcore-row-sharded-static": {"static_shapes": True},
  }.items():
    suites[name] = conformance.Conformance(
      lambda config, opt, options=options: tensorcore(
        config, opt, layouts=TableLayout("row_sharded"), **options
      ),
      tensorcore.capabilities,
    )
  suites["tensorcore-row-sharded-2-replicas"] = conformance.Conformance(
    lambda config, opt: tensorcore(
      config, opt, mirrored_strategy(2), layouts=TableLayout("row_sharded")
    ),
    tensorcore.capabilities,
  )
  suites["restricted"] = conformance.Conformance(RestrictedBackend)
  return suites


SUITES = _runnable()
UNAVAILABLE = [
  n
  for n in registry.names()
  if registry.get(n).unavailable_reason(tf.distribute.get_strategy())
]


@pytest.mark.parametrize("check", conformance.check_names())
@pytest.mark.parametrize("backend", sorted(SUITES))
def test_conformance(backend, check):
  SUITES[backend].run(check)


@pytest.mark.parametrize("backend", UNAVAILABLE)
def test_unavailable_backends_refuse_clearly(backend):
  reason = conformance.check_unavailable(registry.get(backend))
  assert reason


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory):
  """{check: None or failure} of the suite on the parameter_servers backend."""
  out = tmp_path_factory.mktemp("sharded_conformance") / "results.json"
  cluster_lib.run_script(
    ["-m", "tests.distributed.sharded_conformance", str(out)], timeout=300
  )
  with open(out, encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.parametrize("check", conformance.check_names())
def test_conformance_sharded_on_a_cluster(sharded_results, check):
  assert sharded_results[check] is None, sharded_results[check]


def test_the_suite_catches_a_wrong_optimizer():
  """A backend whose update is off is reported, naming the check."""

  class OffByOne(TensorCoreEmbedding):
    def apply_gradients(self, activation_gradients):
      super().apply_gradients(
        {k: g * 1.01 for k, g in activation_gradients.items()}
      )

  with pytest.raises(conformance.ConformanceError, match="SGD after 2 steps"):
    conformance.Conformance(OffByOne).run("optimizer/SGD")


def test_the_suite_catches_an_unclear_refusal():
  """An undeclared input kind refused with a generic error is reported."""

  class Overclaims(RestrictedBackend):
    capabilities = base.Capabilities(input_kinds=frozenset({"dense"}))

    def lookup(self, features, weights=None, training=False):
      if any(isinstance(f, tf.RaggedTensor) for f in features.values()):
        raise ValueError("ragged ids are not supported")
      return super().lookup(features, weights, training)

  suite = conformance.Conformance(Overclaims)
  suite.run("lookup/dense")
  with pytest.raises(conformance.ConformanceError, match="ragged"):
    suite.run("lookup/ragged")


def test_the_suite_catches_an_ignored_quantization():
  """A backend that declares quantization but looks rows up as stored."""

  class Ignores(TensorCoreEmbedding):
    def __init__(self, config, optimizer):
      super().__init__(config, optimizer)
      for table in self.tables:
        table.quantization_config = None

  with pytest.raises(conformance.ConformanceError, match="quantized lookup"):
    conformance.Conformance(Ignores).run("quantization")
