"""MovieLens: one source built in four stages, one module each.

  files.py, split_files.py  read: GroupLens ml-100k / ml-1m or RecBole atomic
                            files into NumPy (split_files: a split given as
                            files, ml-100k's `<fold>.base` / `.test`)
  encoding.py               encode: raw ids and side data -> contiguous ids
                            (0: unknown), vocabularies over every id read
  split.py                  split: random with a seed, or temporal
  raw.py                    features: the raw-value parser the reader and
                            the export's raw serving signature share
  raw_ids.py, stream.py     opt-in, for dynamic tables: user/item ids as
                            raw int64 ids, examples in time order
  source.py                 `MovieLens`, the data source running the stages

The user/item histories are a shared module (`recsys.data.user_history`):
`models.seen_items` builds its exclusion from the same tables. Synthetic
ml-100k-like files for tests and demos: `recsys.testing.movielens`.
"""

from recsys.data.movielens.source import MovieLens, MovieLensConfigError

__all__ = ["MovieLens", "MovieLensConfigError"]
