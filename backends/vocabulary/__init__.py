"""Dynamic vocabularies: tables whose rows go to the ids seen, not to a
fixed id range.

`DynamicVocabulary` (`policy.py`, no TensorFlow) holds a table's settings;
`VocabularyIndex` (`index.py`) is the id -> row index in front of the
table, as TF state and ops; `HashedIds` (`hashed.py`) hashes raw ids into
the rows instead (the baseline); `VocabularyStage` (`stage.py`) is what a
backend runs on each batch (`map_ids`). The names are imported on first
use, so reading the settings does not import TensorFlow.

Example:
  >>> from backends import vocabulary
  >>> policy = vocabulary.DynamicVocabulary(admit_after=2, eviction="lfu")
  >>> index = vocabulary.VocabularyIndex("users", 100_000, policy)
  >>> update = index.update(ids, step)   # update.rows, update.reset_rows
"""

import importlib

_EXPORTS = {
  "HashedIds": "backends.vocabulary.hashed",
  "HashedIndex": "backends.vocabulary.hashed",
  "VocabularyStage": "backends.vocabulary.stage",
  "DynamicVocabulary": "backends.vocabulary.policy",
  "Eviction": "backends.vocabulary.policy",
  "UnknownIds": "backends.vocabulary.policy",
  "VocabularySettingError": "backends.vocabulary.policy",
  "IndexUpdate": "backends.vocabulary.index",
  "VocabularyIdsError": "backends.vocabulary.index",
  "VocabularyIndex": "backends.vocabulary.index",
}

__all__ = sorted([*_EXPORTS, "POLICIES"])


def __getattr__(name):
  if name == "POLICIES":  # what a table's `TableLayout.vocabulary` may be
    return (
      importlib.import_module("backends.vocabulary.policy").DynamicVocabulary,
      importlib.import_module("backends.vocabulary.hashed").HashedIds,
    )
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(
    f"module 'backends.vocabulary' has no attribute {name!r}"
  )


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
