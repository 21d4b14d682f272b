"""MovieLens as a stream: ratings in time order, raw ids, what contradicts them.

Two opt-in settings make MovieLens data for dynamic-vocabulary tables
(tables whose ids are not known in advance):

  time_order  the examples of both splits come oldest first (by timestamp;
              of equal ones, the earlier in the files first: the order the
              temporal split calls older), not shuffled. Input pipeline p
              of P takes examples p, p+P, ... of that order, so each
              pipeline's stream and the global batch move forward in time
              together; a repeated split replays the stream from the start
              each epoch. Needs split="temporal": the evaluation split is
              then the latest `test_fraction` of the ratings, the future
              of the stream trained on.
  raw_ids     user_id and item_id are raw int64 ids (`raw_ids.py`: the
              files' integer ids, or fingerprints of RecBole tokens), their
              specs `FeatureSpec.raw_ids`, instead of contiguous ids.

Refused, naming both settings: time_order with shuffle=True or another
split; raw_ids with task="retrieval" (its candidates, sampling
probabilities and seen-item exclusion index items by contiguous id) or
with a history bag that shares the user_id / item_id table (the bag holds
contiguous ids; a table cannot take both kinds). A history in a table of
its own (`UserHistory.share_item_table = False`,
`ItemHistory.share_user_table = False`) is kept, with contiguous ids.
"""

import numpy as np

from recsys.data.user_history import ItemHistory, UserHistory


def resolved_shuffle(
  shuffle: bool | None,
  time_order: bool,
  split: str,
  error: type[ValueError] = ValueError,
) -> bool:
  """`shuffle` (None: shuffle unless `time_order`), checked against it.

  Raises:
    error: (the source's config error) time_order with shuffle=True or a
      split other than "temporal".
  """
  if not time_order:
    return True if shuffle is None else bool(shuffle)
  if shuffle:
    raise error(
      "MovieLens.time_order = True delivers the training ratings oldest "
      "first, but MovieLens.shuffle = True shuffles them: leave shuffle "
      "unset (None: off with time_order) or set it to False."
    )
  if split != "temporal":
    raise error(
      "MovieLens.time_order = True streams the ratings in time order to "
      f"evaluate on what comes after, but MovieLens.split = {split!r} "
      "takes test ratings from the whole period: set MovieLens.split = "
      "'temporal' (the latest test_fraction of the ratings)."
    )
  return False


def check_raw_ids(
  task: str,
  history: UserHistory | None,
  item_history: ItemHistory | None,
  error: type[ValueError] = ValueError,
) -> None:
  """Raw ids with settings that need contiguous user / item ids.

  Args:
    task: "ranking" or "retrieval".
    history, item_history: the history features chosen (None: none).
    error: the source's config error.

  Raises:
    error: naming MovieLens.raw_ids and the other setting.
  """
  if task == "retrieval":
    raise error(
      "MovieLens.raw_ids = True is for task='ranking': with "
      "MovieLens.task = 'retrieval' the candidates, their sampling "
      "probabilities and the seen-item exclusion index items by contiguous "
      "id. Leave raw_ids off for retrieval."
    )
  for setting, kind, shared in (
    ("UserHistory.share_item_table", "item_id", history),
    ("ItemHistory.share_user_table", "user_id", item_history),
  ):
    if shared is not None and shared.table is not None:
      raise error(
        f"MovieLens.raw_ids = True delivers {kind} as raw ids, but "
        f"{shared.feature_name!r} shares the {kind} table ({setting} = "
        f"True) and holds contiguous {kind}s: one table cannot take both. "
        f"Set {setting} = False (the bag in a table of its own, with "
        f"contiguous ids; pass the history as MovieLens.history / "
        "item_history to bind it), drop the feature, or leave raw_ids off."
      )


def time_ordered(rows: np.ndarray, timestamps: np.ndarray) -> np.ndarray:
  """`rows` (indices into the ratings read) oldest first; of equal
  timestamps, the earlier row (line) first."""
  rows = np.asarray(rows)
  return rows[np.lexsort((rows, np.asarray(timestamps)[rows]))]


__all__ = [
  "check_raw_ids",
  "resolved_shuffle",
  "time_ordered",
]
