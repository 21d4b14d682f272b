""" "Did you mean": the closest valid names to a misspelt one.

One helper for every error that lists valid choices: backend names, gin
configurables and parameters, combiners, embedding optimizers. It imports
nothing but the standard library, so `recsys` uses it as well.

Example:
  >>> closest("tensorcor", ["parameter_servers", "tensorcore"])
  ['tensorcore']
  >>> did_you_mean("Adagard", ["SGD", "Adagrad"])
  " Did you mean 'Adagrad'?"
"""

import difflib
from collections.abc import Sequence


def closest(
  name: str, candidates: Sequence[str], n: int = 3, cutoff: float = 0.6
) -> list[str]:
  """Up to `n` candidates close to `name`, closest first (case-insensitive).

  Args:
    name: the misspelt name.
    candidates: the valid names, as they are spelt.
    n: how many to return at most.
    cutoff: `difflib` similarity in [0, 1] below which a name is not close.

  Returns:
    The candidates as spelt in `candidates`.
  """
  lowered = {str(c).lower(): c for c in candidates}
  close = difflib.get_close_matches(
    str(name).lower(), list(lowered), n=n, cutoff=cutoff
  )
  return [lowered[c] for c in close]


def did_you_mean(
  name: str, candidates: Sequence[str], cutoff: float = 0.6
) -> str:
  """`" Did you mean 'x'?"` for the closest candidate, else ''."""
  close = closest(name, candidates, n=1, cutoff=cutoff)
  return f" Did you mean {close[0]!r}?" if close else ""


__all__ = ["closest", "did_you_mean"]
