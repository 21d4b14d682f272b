"""A failing test is named the moment it fails, under xdist as `make test`.

A `pytest -q -n 2` run (no TensorFlow: ~2 s) of two tests: one
fails at once, the other waits until this test has read `FAILED <nodeid>`
from the run's output, so the name must come while the run is still going,
not in the closing summary (which a run stopped by Ctrl-C or killed at CI's
limit never prints).
"""

import os
import queue
import subprocess
import sys
import textwrap
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TESTS = textwrap.dedent("""
  import os, time

  def test_fails():
    assert 1 == 2

  def test_waits_for_the_name_to_be_read():
    deadline = time.time() + 60
    while not os.path.exists(os.environ["NAME_READ"]):
      assert time.time() < deadline, "the failure was not named in time"
      time.sleep(0.05)
""")


def _pump(stream, lines):
  for line in stream:
    lines.put(line)
  lines.put(None)


def test_a_failure_is_named_while_the_run_goes_on(tmp_path):
  (tmp_path / "test_two.py").write_text(TESTS)
  name_read = tmp_path / "name_read"
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
  # Only the plugins the run needs: hypothesis's and the others' imports
  # cost three times the run.
  env.update(
    PYTHONPATH=ROOT,
    NAME_READ=str(name_read),
    PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
  )
  proc = subprocess.Popen(
    [sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-n", "2"]
    + ["-p", "no:cacheprovider", "-p", "tests.report_failures", "test_two.py"],
    cwd=tmp_path,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  lines: queue.Queue = queue.Queue()
  threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
  seen = []
  try:
    while True:
      line = lines.get(timeout=60)
      assert line is not None, f"the run ended without naming it: {seen}"
      seen.append(line)
      if line.strip() == "FAILED test_two.py::test_fails":
        break
    name_read.touch()  # only now may the other test end
    assert proc.wait(timeout=60) == 1, seen
  finally:
    proc.kill()
    proc.wait()
  while (line := lines.get(timeout=10)) is not None:
    seen.append(line)
  assert "1 failed, 1 passed" in seen[-1], seen


def test_the_suite_registers_it_where_its_terminal_is(request):
  """tests/conftest.py registers the plugin in the process that prints:
  pytest's own, or xdist's controller, not its workers."""
  config = request.config
  registered = config.pluginmanager.has_plugin("failures-at-once")
  assert registered == (not hasattr(config, "workerinput"))
