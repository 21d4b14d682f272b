"""Each test file's measured cost, for the order `make test` hands files out.

`tests/file_costs.json` holds the seconds each file took (setup, call and
teardown of its tests) in one run of the whole suite on two workers; the
conftest hands the files out most expensive first, so that neither worker
is left with a long file at the end. A file the JSON does not list is
estimated from its tests (a slow one ~10 s, another ~0.15 s). After tests
move or change much, measure again:

  .venv/bin/python -m pytest -q -n 2 --dist loadfile \\
      --no-loadscope-reorder --durations=0 > durations.log
  .venv/bin/python -m tests.file_costs durations.log
"""

import json
import os
import re
import sys
from collections import Counter

PATH = os.path.join(os.path.dirname(__file__), "file_costs.json")
_LINE = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+([^:\s]+)::")


def load() -> dict[str, float]:
  """{repository-relative path: seconds}; empty when the file is missing."""
  try:
    with open(PATH, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    return {}


def from_durations(lines) -> dict[str, float]:
  """Seconds per test file from pytest's `--durations=0` lines."""
  cost: Counter = Counter()
  for line in lines:
    match = _LINE.match(line)
    if match:
      cost[match.group(2)] += float(match.group(1))
  return {path: round(seconds, 1) for path, seconds in sorted(cost.items())}


def main(argv: list[str]) -> None:
  with open(argv[0], encoding="utf-8") as f:
    costs = from_durations(f)
  with open(PATH, "w", encoding="utf-8") as f:
    json.dump(costs, f, indent=1, sort_keys=True)
    f.write("\n")
  print(f"{len(costs)} files, {sum(costs.values()):.0f} s in all -> {PATH}")


if __name__ == "__main__":
  main(sys.argv[1:])
