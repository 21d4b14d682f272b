"""How a `recsys` command hands over its results: JSON for scripts, one
line for people.

The metrics go to stdout as one JSON document where a program reads them
(stdout is a pipe or a file) or when asked (`--verbosity info`); on a
terminal at the default verbosity they are left to the run folder's files,
which the last line names. Every command ends with that one line on stderr:
`recsys <command>: <the key metric(s)>; <where the results are>.` (MovieLens
and iALS runs used to end with 12-19 lines of JSON and nothing else.)
"""

import json
import sys
from collections.abc import Mapping
from typing import Any

from recsys.process import console


def wants_json(verbosity: str | None) -> bool:
  """Whether the metrics go to stdout as JSON (see the module docstring)."""
  isatty = getattr(sys.stdout, "isatty", lambda: False)
  return not isatty() or console.shows_details(verbosity)


def print_metrics(metrics: Mapping[str, Any], verbosity: str | None) -> None:
  """`metrics` as one JSON document on stdout, if `wants_json`."""
  if wants_json(verbosity):
    print(json.dumps(metrics, indent=2, sort_keys=True), flush=True)


def summary(command: str, text: str) -> None:
  """The command's last line, on stderr (after the JSON on stdout)."""
  sys.stdout.flush()
  print(f"recsys {command}: {text}", file=sys.stderr, flush=True)
