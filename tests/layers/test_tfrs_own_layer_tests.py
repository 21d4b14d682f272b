"""TFRS's own unit tests of its embedding layer, with one line swapped.

The installed tensorflow-recommenders wheel ships
`layers/embedding/tpu_embedding_layer_test.py`. Run as a TFRS user would
after porting: its import of TFRS's layer module becomes `from recsys
import layers`, and the line that builds `tpu_embedding_layer.TPUEmbedding`
builds `layers.Embedding`. Nothing else changes (not copied here: read from
the wheel and run in a fresh process).
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
IMPORT = (
  "from tensorflow_recommenders.layers.embedding import tpu_embedding_layer"
)
BUILD = "tpu_embedding_layer.TPUEmbedding("


def _tfrs_layer_test() -> pathlib.Path | None:
  spec = importlib.util.find_spec("tensorflow_recommenders")
  if spec is None or not spec.submodule_search_locations:
    return None
  root = pathlib.Path(list(spec.submodule_search_locations)[0])
  path = root / "layers" / "embedding" / "tpu_embedding_layer_test.py"
  return path if path.exists() else None


@pytest.mark.slow
def test_tfrs_layer_tests_pass_with_the_import_swapped(tmp_path):
  source_path = _tfrs_layer_test()
  if source_path is None:
    pytest.skip("the installed tensorflow-recommenders has no layer tests")
  source = source_path.read_text()
  assert source.count(IMPORT) == 1 and source.count(BUILD) == 1
  swapped = source.replace(IMPORT, "from recsys import layers").replace(
    BUILD, "layers.Embedding("
  )
  test_file = tmp_path / "tpu_embedding_layer_test.py"
  test_file.write_text(swapped)
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    ),
    TF_CPP_MIN_LOG_LEVEL="3",
  )
  env.pop("TF_USE_LEGACY_KERAS", None)  # `import recsys` must set it itself
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-q",
      "-p",
      "no:cacheprovider",
      str(test_file),
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  summary = run.stdout.strip().splitlines()[-1] if run.stdout else ""
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
  assert "12 passed" in summary, summary
