"""A serving process that cannot import the project, shared by the tests.

`ServingProcess` starts a Python process (no PYTHONPATH, another working
directory) whose first lines block `recsys`, `backends` and `tests` from
importing; it then loads SavedModels with TensorFlow alone and runs their
signatures on the arrays a test sends. The `serving_process` fixture
(`tests/conftest.py`) starts one per test session (per xdist worker) when a
test first asks for it: TensorFlow starts once, not once per test file.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

# Run first in the fresh process: `recsys` and `backends` must not load.
NO_PROJECT = textwrap.dedent("""
    import sys
    class _Blocked:
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("recsys", "backends", "tests"):
          raise ImportError(name + " is not importable in the serving process")
    sys.meta_path.insert(0, _Blocked())
    try:
      import recsys
    except ImportError:
      pass
    else:
      raise SystemExit("recsys is importable in the serving process")
""")

# The serving process: TensorFlow only. It loads each request's SavedModel and
# runs its calls; requests and replies are JSON lines (arrays in .npz files).
SERVER = NO_PROJECT + textwrap.dedent("""
    import json, traceback
    import numpy as np, tensorflow as tf
    models = {}  # export dir -> the loaded SavedModel (loaded once)
    for line in sys.stdin:
      request = json.loads(line)
      try:
        if request["export_dir"] not in models:
          models[request["export_dir"]] = tf.saved_model.load(request["export_dir"])
        loaded = models[request["export_dir"]]
        arrays = np.load(request["inputs"])
        out = {}
        for result, (signature, inputs) in request["plan"].items():
          fn = loaded.signatures[signature]
          got = fn(**{name: tf.constant(arrays[key]) for name, key in inputs.items()})
          for name, value in got.items():
            value = value.numpy()
            out[result + "__" + name] = value.astype(bytes) if value.dtype == object else value
        np.savez(request["outputs"], **out)
        reply = {"ok": True}
      except Exception:  # reported to the test, which fails with it
        reply = {"ok": False, "error": traceback.format_exc()}
      print(json.dumps(reply), flush=True)
""")


class ServingProcess:
  """A serving process: TensorFlow only, nothing of the project importable."""

  def __init__(self, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    self._stderr = os.path.join(cwd, "stderr.txt")
    with open(
      self._stderr, "w"
    ) as stderr:  # a file: a full pipe would block it
      self._process = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
      )

  def serve(self, tmp_path, export_dir, calls, expect_error=False):
    """Runs `calls` ({result: (signature, inputs)}) on the export; their outputs.

    Inputs are NumPy arrays (strings as str arrays). With `expect_error`, the
    calls must fail: returns the serving process's traceback.
    """
    arrays, plan = {}, {}
    for result, (signature, inputs) in calls.items():
      plan[result] = [signature, {}]
      for name, value in inputs.items():
        key = f"{result}__{name}"
        arrays[key] = np.asarray(value)
        plan[result][1][name] = key
    np.savez(tmp_path / "inputs.npz", **arrays)
    request = {
      "export_dir": export_dir,
      "plan": plan,
      "inputs": str(tmp_path / "inputs.npz"),
      "outputs": str(tmp_path / "outputs.npz"),
    }
    self._process.stdin.write(json.dumps(request) + "\n")
    self._process.stdin.flush()
    line = self._process.stdout.readline()
    if not line:
      with open(self._stderr) as stderr:
        raise AssertionError(
          "the serving process died: " + stderr.read()[-3000:]
        )
    reply = json.loads(line)
    if expect_error:
      assert not reply["ok"], "the call succeeded; expected an error"
      return reply["error"]
    assert reply["ok"], reply["error"]
    got = {}
    with np.load(tmp_path / "outputs.npz", allow_pickle=False) as outputs:
      for key in outputs.files:
        result, name = key.split("__", 1)
        got.setdefault(result, {})[name] = outputs[key]
    return got

  def close(self):
    self._process.stdin.close()
    try:
      self._process.wait(timeout=60)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
