"""An export of dynamic-vocabulary tables serves raw ids in plain TF.

A run trained on the drifting stream is exported twice: from its own
backend's indices (`export(trainer.run)`), and restored on the lookup-only
export backend as `recsys export` does, which reads the tables and, from
the same checkpoint, each table's index. The SavedModel carries each index
as a hash table. Served in a process that cannot import the
project, raw ids the model admitted score as the trained model scores
them (the rows the index gave them), and ids it never admitted score as
the default reads (zeros: left out of their bags).
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf

from recsys.features import EmbeddingSettings
from recsys.run.restored import RestoredRun
from recsys.serving import export as export_lib
from recsys.train_settings import TrainSettings
from tests.training import test_dynamic_training as dynamic_training

_SERVE = textwrap.dedent("""
    import json, sys
    class _Blocked:
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("recsys", "backends", "tests"):
          raise ImportError(name + " is not importable in the serving process")
    sys.meta_path.insert(0, _Blocked())
    import numpy as np
    import tensorflow as tf
    export_dir, inputs, outputs = sys.argv[1:]
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    with np.load(inputs) as arrays:
      got = serve(**{k: tf.constant(arrays[k]) for k in arrays.files})
    np.save(outputs, got["scores"].numpy())
""")


def _serve(tmp_path, export_dir, inputs) -> np.ndarray:
  np.savez(tmp_path / "inputs.npz", **inputs)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  done = subprocess.run(
    [
      sys.executable,
      "-c",
      _SERVE,
      str(export_dir),
      str(tmp_path / "inputs.npz"),
      str(tmp_path / "scores.npy"),
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return np.load(tmp_path / "scores.npy")


def test_the_export_maps_raw_ids_as_the_trained_index_does(tmp_path):
  """Both exports (from the trained backend's indices, and from the
  checkpoint's through the lookup-only export backend) score admitted ids
  as the trained model does and unknown ids as its default (zeros)."""
  trainer = dynamic_training._trainer(tmp_path / "run")
  trainer.train()
  run = trainer.run
  source = run.source
  features, _ = next(iter(source.dataset(16, training=False)))
  admitted, _ = run.backend.dynamic_tables()["C1"].mapping()
  assert int(tf.size(admitted)) >= 8
  categorical = dict(features["categorical"])
  # Rows 0-7: C1 ids the index holds; 8-15: ids it never saw.
  categorical["C1"] = tf.concat(
    [admitted[:8], tf.constant([12345 + i for i in range(8)], tf.int64)], 0
  )
  features = {**features, "categorical": categorical}
  names = list(run.backend.feature_config)
  mapped = run.backend.map_ids(
    {n: categorical[n] for n in names}, training=False
  )
  assert np.all(mapped["C1"].numpy()[8:] < 0)  # unknown: left out
  acts = run.backend.lookup(mapped, training=False)
  want = run.model(acts, features, training=False).numpy().reshape(-1)

  inputs = {"dense": features["dense"].numpy()}
  for name in names:
    ids = categorical[name]
    if isinstance(ids, tf.RaggedTensor):
      ids = ids.to_tensor(default_value=-1)
    inputs[name] = ids.numpy().astype(np.int64)

  export_lib.export(run, str(tmp_path / "from_backend"))
  got = _serve(tmp_path, tmp_path / "from_backend", inputs).reshape(-1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  restored = RestoredRun(
    str(tmp_path / "run"),
    dynamic_training._source(),
    dynamic_training.MODEL,
    settings=TrainSettings(
      embedding=EmbeddingSettings(dim=7),
      embedding_optimizer=tf.tpu.experimental.embedding.Adagrad(0.1),
      placement=run.settings.placement,
      backend="serving",
      global_batch_size=20,
      seed=3,
      progress_bar=False,
      summaries=False,
    ),
  )
  assert not restored.backend.dynamic_tables()  # the lookup-only backend
  export_lib.export(restored, str(tmp_path / "from_checkpoint"))
  got = _serve(tmp_path, tmp_path / "from_checkpoint", inputs).reshape(-1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
