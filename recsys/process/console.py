"""What a `recsys` command shows on the terminal, at each `--verbosity`.

A plain `recsys train` printed 78 lines of which ~4 mattered. By default
(`brief`) a command shows its warnings and errors and the log records its
user needs, each tagged with what it says (`extra=shown_as(KIND)`): the
devices, the embedding backend and its memory plan, the data read, the
progress, a line before a step that takes seconds. `info` shows every
record of recsys's loggers as before (rates, checkpoints, evaluations,
memory); `debug` adds TensorFlow's own logs and full tracebacks.

The tags cost nothing elsewhere: a Python user's `logging` set-up sees every
record at its level, tagged or not.

Example:
  >>> log.info("step %d: evaluating ...", step, extra=shown_as(STATUS))
"""

import logging
import sys
from typing import IO, Any

VERBOSITIES = ("brief", "info", "debug")
DEFAULT_VERBOSITY = "brief"

#: The attribute of a log record that says what it tells the user.
ATTRIBUTE = "recsys_console"
#: The kinds of record a brief command may show.
DEVICES = "devices"  # what TensorFlow found: CPUs, GPUs
PLAN = "plan"  # the embedding backend chosen and the tables' memory plan
DATA = "data"  # the data a source read (rows, users, splits)
PROGRESS = "progress"  # training progress, when no progress bar is drawn
STATUS = "status"  # what runs now, before a step that takes seconds

#: The kinds each command shows at `brief` (others: warnings and errors).
BRIEF = {
  "train": frozenset({DEVICES, PLAN, DATA, PROGRESS, STATUS}),
  "evaluate": frozenset({DEVICES, DATA, STATUS}),
  "export": frozenset({STATUS}),
}


def shown_as(kind: str) -> dict[str, Any]:
  """The `extra=` of a log record of `kind` (one of the kinds above)."""
  return {ATTRIBUTE: kind}


def kind_of(record: logging.LogRecord) -> str | None:
  """The kind a record was tagged with (None: untagged)."""
  return getattr(record, ATTRIBUTE, None)


class _Brief(logging.Filter):
  """Warnings, errors and the records of the command's kinds."""

  def __init__(self, kinds: frozenset[str]):
    super().__init__()
    self.kinds = kinds

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or kind_of(record) in self.kinds


class _BriefFormatter(logging.Formatter):
  """A tagged record as its message alone; a warning or error named so."""

  def format(self, record: logging.LogRecord) -> str:
    message = super().format(record)
    if record.levelno >= logging.WARNING and kind_of(record) is None:
      return f"{record.levelname.lower()}: {message}"
    return message


#: The log line of `info` and `debug` (and of recsys before `brief`).
DETAILED_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def handler(
  command: str, verbosity: str, stream: IO[str] | None = None
) -> logging.Handler:
  """The console handler of `command` at `verbosity`, writing to `stream`
  (default: stderr)."""
  out = logging.StreamHandler(stream if stream is not None else sys.stderr)
  if verbosity == "brief":
    out.addFilter(_Brief(BRIEF.get(command, frozenset())))
    out.setFormatter(_BriefFormatter("%(message)s"))
  else:
    out.setFormatter(logging.Formatter(DETAILED_FORMAT, datefmt="%H:%M:%S"))
  return out


def configure(command: str, verbosity: str) -> None:
  """Sets up the process's logging for `command` at `verbosity`.

  As `logging.basicConfig`, nothing is changed when the process set up its
  logging already (a notebook, a test run): its own handlers decide.
  """
  root = logging.getLogger()
  if verbosity == "debug":
    logging.getLogger("recsys").setLevel(logging.DEBUG)
  if root.handlers:
    return
  root.addHandler(handler(command, verbosity))
  root.setLevel(logging.INFO)


def shows_details(verbosity: str | None) -> bool:
  """Whether `verbosity` shows more than the brief output."""
  return verbosity in ("info", "debug")
