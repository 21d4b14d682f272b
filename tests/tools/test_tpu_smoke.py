"""The TPU smoke tool's parts that run without a TPU: reference, errors."""

import json
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from recsys.tools import tpu_smoke
from tests.backends import tf_v0_on_cpu
from tests.conftest import mirrored_strategy


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_unreachable_tpu_fails_fast_with_a_clear_message():
  address = f"grpc://127.0.0.1:{_closed_port()}"
  start = time.monotonic()
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "recsys.tools.tpu_smoke",
      "--tpu",
      address,
      "--connect_timeout",
      "5",
    ],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert time.monotonic() - start < 30
  assert result.returncode == 2
  assert f"TPU '{address}': cannot connect" in result.stderr


def test_no_tpu_there_is_one_line_naming_what_was_tried(monkeypatch, capsys):
  """Issue 52: without a TPU the tool printed TF's 33-line traceback. The
  child that connects (faked here: TF's answer on a CPU machine) reports
  its error; the tool says it in one line, with how to name a TPU."""
  error = {
    "error": "NotFoundError",
    "message": "TPUs not found in the cluster. Failed in initialization: "
    "No OpKernel was registered to support Op 'ConfigureDistributedTPU'\n"
    "Registered devices: [CPU]\n\t [[ConfigureDistributedTPU]]",
  }

  def child(cmd, **kwargs):
    del kwargs
    assert "TPUClusterResolver(tpu='local')" in cmd[-1]
    return subprocess.CompletedProcess(
      cmd, 3, stdout=json.dumps(error) + "\n", stderr="Traceback ...\n" * 33
    )

  monkeypatch.setattr(tpu_smoke.subprocess, "run", child)
  assert tpu_smoke.main(["--tpu", "local"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1, err
  assert err == (
    "error: TPU 'local': no TPU found (tried TPUClusterResolver(tpu='local') "
    "and initialize_tpu_system: NotFoundError: TPUs not found in the "
    "cluster.); on a TPU VM pass --tpu local; elsewhere the TPU's name "
    "(--tpu my-tpu, with gcloud's project and zone set) or its address "
    "(--tpu grpc://<host>:8470).\n"
  )


@pytest.mark.slow
def test_cpu_reference_equals_replicas_on_the_same_global_batches(tmp_path):
  """tensorcore@cpu joins the replicas' batches: 1 replica == 2 replicas."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  two = tpu_smoke.read_on_cpu(
    tpu_smoke.train_and_save(
      mirrored_strategy(2),
      "tensorcore",
      "adagrad",
      steps=2,
      per_replica_batch=4,
      out=str(tmp_path / "two"),
    ),
    "adagrad",
  )
  one = tpu_smoke.read_on_cpu(
    tpu_smoke.train_and_save(
      tf.distribute.get_strategy(),
      "tensorcore",
      "adagrad",
      steps=2,
      per_replica_batch=4,
      out=str(tmp_path / "one"),
      replicas=2,
    ),
    "adagrad",
  )
  assert sorted(one) == sorted(two)
  for key in one:
    np.testing.assert_allclose(
      one[key], two[key], rtol=1e-5, atol=1e-6, err_msg=key
    )


@pytest.mark.slow
@pytest.mark.parametrize(
  "run_name",
  ["tensorcore+dynamic", "tpu_embedding_v0+dynamic", "tensorcore+dynamic_kept"],
)
def test_dynamic_run_on_two_replicas_equals_the_joined_cpu_reference(
  run_name, tmp_path, monkeypatch
):
  """tensorcore and tpu_embedding_v0 (TF's V0 itself, on CPU) with a
  dynamic table map each batch on the host before strategy.run (a TPU's
  way): on 2 replicas the checkpoint — tables, slots and the index's ids,
  rows and counters — is the one-replica tensorcore reference's. The
  index of "+dynamic" evicted (reused rows reset); that of
  "+dynamic_kept" (what tpu_embedding takes) never did, its unknown ids
  reading the unknown row."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf_v0_on_cpu.allow(monkeypatch)
  vocabulary = tpu_smoke._vocabulary(run_name)
  reference = tpu_smoke._reference(run_name)

  def run(strategy, out, backend, replicas=None):
    path = tpu_smoke.train_and_save(
      strategy,
      backend,
      "adagrad",
      steps=4,
      per_replica_batch=24,
      out=str(tmp_path / out),
      replicas=replicas,
      vocabulary=vocabulary,
    )
    return tpu_smoke.read_checkpoint(path)

  two = run(mirrored_strategy(2), "two", tpu_smoke._backend_of(run_name))
  one = run(
    tf.distribute.get_strategy(),
    "one",
    tpu_smoke._backend_of(reference),
    replicas=2,
  )
  counter = "embedding/vocabularies/tables/users/{}/.ATTRIBUTES/VARIABLE_VALUE"
  if run_name.endswith("_kept"):
    assert reference == "tensorcore+dynamic_kept@cpu"
    assert int(one[counter.format("evictions")]) == 0
    assert int(one[counter.format("default_hits")]) > 0
  else:
    assert reference == "tensorcore+dynamic@cpu"
    assert int(one[counter.format("evictions")]) > 0
  ok, worst = tpu_smoke.compare(two, one, rtol=1e-5, atol=1e-6)
  assert ok, worst
  moved = dict(one)
  moved[counter.format("evictions")] += 1
  assert not tpu_smoke.compare(two, moved, rtol=1e-5, atol=1e-6)[0]
