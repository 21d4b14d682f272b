"""The Markdown tables the benchmark scripts print.

One helper writes the pipes and the rule, so that every script's table reads
(and parses) the same and a rule always has as many cells as its header.
Standard library only: the torch children (their own venv) import this
folder's modules too.
"""

from collections.abc import Iterable


def print_table(header: str, rows: Iterable[str]) -> None:
  """Prints `| header |`, its `|---|` rule, then `| row |` for each row.

  Args:
    header: the column names, joined by " | " (no outer pipes).
    rows: each row's cells, formatted and joined the same way.
  """
  print(f"| {header} |")
  print("|" + "---|" * (header.count("|") + 1))
  for row in rows:
    print(f"| {row} |")
