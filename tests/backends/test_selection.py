"""Backend selection for every strategy and TPU embedding feature, and refusals.

TPU strategies are fakes of `strategy.extended.tpu_hardware_feature` (no TPU
is reachable here; the only place fakes are used); the default and mirrored
strategies are real, and so is the parameter-server strategy (an in-process
cluster, in a subprocess because it reconfigures TF's runtime).
"""

import logging  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import backends  # noqa: E402
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import registry  # noqa: E402
from tests.conftest import mirrored_strategy  # noqa: E402

E = tf.tpu.experimental.embedding
FEATURE = tf.tpu.experimental.HardwareFeature.EmbeddingFeature


class FakeTPUStrategy:
  """Stands in for a TPUStrategy: only its hardware feature is faked."""

  def __init__(self, embedding_feature, num_replicas=2, sparsecores_per_chip=4):
    self.num_replicas_in_sync = num_replicas
    self.extended = types.SimpleNamespace(
      tpu_hardware_feature=types.SimpleNamespace(
        embedding_feature=embedding_feature,
        num_embedding_devices_per_chip=sparsecores_per_chip,
      ),
      worker_devices=tuple(
        f"/job:worker/replica:0/task:0/device:TPU:{i}"
        for i in range(num_replicas)
      ),
    )


def fake_tpu_strategy(feature_name: str, **kwargs) -> FakeTPUStrategy:
  return FakeTPUStrategy(getattr(FEATURE, feature_name), **kwargs)


def _config():
  return {"f": E.FeatureConfig(E.TableConfig(23, 7, name="t"))}


@pytest.mark.parametrize(
  "feature,want,why",
  [
    ("V2", "tpu_embedding", "embedding_feature=V2: SparseCore"),
    ("V1", "tpu_embedding", "embedding_feature=V1: the embedding engine"),
    (
      "UNSUPPORTED",
      "tensorcore",
      "embedding_feature=UNSUPPORTED: no embedding",
    ),
  ],
)
def test_tpu_selection_follows_the_embedding_feature(feature, want, why):
  name, reason = backends.select(fake_tpu_strategy(feature))
  assert name == want
  assert why in reason


def test_default_and_mirrored_strategies_choose_tensorcore():
  name, reason = backends.select(tf.distribute.get_strategy())
  assert name == "tensorcore" and "default device" in reason
  name, reason = backends.select(mirrored_strategy(2))
  assert name == "tensorcore" and "CPU:1" in reason


def test_auto_is_logged_in_one_line_with_its_reason(caplog):
  with caplog.at_level(logging.INFO, logger="recsys.backends"):
    registry.resolve("auto", fake_tpu_strategy("UNSUPPORTED"))
  lines = [r.getMessage() for r in caplog.records]
  assert lines == [
    "embedding backend auto -> tensorcore (FakeTPUStrategy, "
    "embedding_feature=UNSUPPORTED: no embedding accelerator, "
    "tables on the TensorCores (replicated or row-sharded, per table))"
  ]


@pytest.mark.parametrize(
  "feature,want",
  [
    ("V1", ["tensorcore", "tpu_embedding", "tpu_embedding_v0"]),
    ("V2", ["tensorcore", "tpu_embedding", "tpu_embedding_v0"]),
    ("UNSUPPORTED", ["tensorcore", "tpu_embedding_v0"]),
  ],
)
def test_available_backends_on_tpus(feature, want):
  assert backends.available(fake_tpu_strategy(feature)) == want


def test_available_backends_on_cpu():
  assert backends.available(tf.distribute.get_strategy()) == [
    "serving",
    "tensorcore",
  ]


def test_forcing_a_backend_that_can_run():
  name, reason = registry.resolve("tpu_embedding_v0", fake_tpu_strategy("V1"))
  assert name == "tpu_embedding_v0" and "forced" in reason
  emb = backends.create(
    _config(), E.SGD(0.1), fake_tpu_strategy("V1"), backend="tpu_embedding_v0"
  )
  assert emb.name == "tpu_embedding_v0"


@pytest.mark.parametrize(
  "strategy_fn,backend,expected",
  [
    (
      tf.distribute.get_strategy,
      "tpu_embedding",
      r"'tpu_embedding' was requested but cannot run under "
      r"_DefaultDistributionStrategy: it needs a TPUStrategy on hardware with "
      r"embedding_feature V1 or V2; this is _DefaultDistributionStrategy on "
      r"the "
      r"default device\. Use backend='auto' \(here: 'tensorcore'\)",
    ),
    (
      lambda: fake_tpu_strategy("UNSUPPORTED"),
      "tpu_embedding",
      r"this TPU has embedding_feature=UNSUPPORTED\. Use 'tensorcore'",
    ),
    (
      lambda: mirrored_strategy(2),
      "tpu_embedding_v0",
      r"TPUEmbeddingV0 only runs under a TPUStrategy; this is "
      r"MirroredStrategy\. "
      r"Use 'tensorcore'",
    ),
    (
      lambda: fake_tpu_strategy("V1"),
      "serving",
      r"TPUEmbeddingForServing runs on CPU/GPU only.*or one of tensorcore, "
      r"tpu_embedding, tpu_embedding_v0",
    ),
    (
      tf.distribute.get_strategy,
      "parameter_servers",
      r"needs a ParameterServerStrategy .* or use 'tensorcore'",
    ),
  ],
)
def test_forced_backend_that_cannot_run_is_refused_with_why_and_what_instead(
  strategy_fn, backend, expected
):
  with pytest.raises(backends.BackendUnavailableError, match=expected):
    backends.create(_config(), E.SGD(0.1), strategy_fn(), backend=backend)


def test_constructing_an_unavailable_backend_directly_is_refused():
  from backends.mid_level.tpu_embedding import TPUEmbeddingBackend  # pylint: disable=g-import-not-at-top

  with pytest.raises(
    backends.BackendUnavailableError, match="'tpu_embedding' cannot run here"
  ):
    TPUEmbeddingBackend(_config(), E.SGD(0.1))


def test_unknown_backend_lists_the_valid_names():
  with pytest.raises(
    backends.UnknownBackendError,
    match="available: parameter_servers, serving, tensorcore, "
    "tpu_embedding, tpu_embedding_v0",
  ):
    backends.create(_config(), E.SGD(0.1), backend="tpuv2")


@pytest.mark.slow
def test_parameter_server_strategy_selects_sharded():
  script = textwrap.dedent("""
      import os, socket
      import recsys, tensorflow as tf, backends
      def port():
        with socket.socket() as s:
          s.bind(("localhost", 0))
          return s.getsockname()[1]
      spec = tf.train.ClusterSpec({"worker": [f"localhost:{port()}"],
                                   "ps": [f"localhost:{port()}"],
                                   "chief": [f"localhost:{port()}"]})
      servers = [tf.distribute.Server(spec, job_name=j, task_index=0,
                                      protocol="grpc") for j in ("worker",
                                      "ps")]
      resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
          spec, rpc_layer="grpc", task_type="chief", task_id=0)
      strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
      print("SELECTED", *backends.select(strategy), sep="|", flush=True)
      os._exit(0)
      """)
  out = subprocess.run(
    [sys.executable, "-c", script],
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  ).stdout
  line = next(l for l in out.splitlines() if l.startswith("SELECTED"))
  _, name, reason = line.split("|")
  assert name == "parameter_servers"
  assert "split over the parameter servers" in reason


def test_the_old_name_of_the_parameter_server_backend_still_works(
  monkeypatch,
):
  """`sharded`, the parameter-server backend's name before it was
  `parameter_servers`, still resolves (gin files, `--backend`), with one
  warning per process naming the new name."""
  monkeypatch.setattr(registry, "_warned", set())
  with pytest.warns(FutureWarning, match="'parameter_servers'") as seen:
    cls = registry.get("sharded")
    registry.check_options("sharded", {})
  assert len(seen) == 1
  assert cls is registry.get("parameter_servers")
  assert "sharded" not in registry.names()
  strategy = tf.distribute.get_strategy()
  assert registry.decide("sharded", strategy)[0] == "parameter_servers"
