"""A failing test's name, printed the moment it fails: `FAILED <nodeid>`.

pytest names failures in its closing summary, which a run stopped by Ctrl-C
before it, or killed at CI's time limit, never prints: `pytest -q` then
showed a line of dots and Fs and no name. This plugin writes each failure
(an error in set-up or tear-down too, and a test whose xdist worker
crashed) through the terminal reporter as its report arrives: under xdist
in the controller, which receives every worker's reports. tests/conftest.py
registers it; `pytest -p tests.report_failures` does elsewhere.
"""

import pytest

#: Where in a test it failed; xdist's report of a crashed worker has none.
PHASES = {"call": "", "setup": " (in set-up)", "teardown": " (in tear-down)"}


class FailuresAtOnce:
  """Writes `FAILED <nodeid>` (and where, if not in the test's body) on a
  line of its own for each failure."""

  def __init__(self, terminal):
    self.terminal = terminal

  @pytest.hookimpl(trylast=True)
  def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
    if not report.failed:
      return
    phase = PHASES.get(report.when, " (its worker crashed)")
    self.terminal.ensure_newline()
    # Progress letters (`..F`) leave the line open; ensure_newline does not
    # know of them.
    if getattr(self.terminal._tw, "width_of_current_line", 1):
      self.terminal.write("\n")
    self.terminal.write_line(f"FAILED {report.nodeid}{phase}", red=True)
    self.terminal.flush()  # piped to a log, stdout is block-buffered


@pytest.hookimpl(trylast=True)  # after the terminal reporter's
def pytest_configure(config: pytest.Config) -> None:
  """Registers the reporter where the terminal is: not in xdist workers."""
  terminal = config.pluginmanager.get_plugin("terminalreporter")
  if terminal is None or hasattr(config, "workerinput"):
    return
  if not config.pluginmanager.has_plugin("failures-at-once"):
    config.pluginmanager.register(FailuresAtOnce(terminal), "failures-at-once")
