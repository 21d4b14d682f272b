"""Retrieval models and their parts, as TFRS splits them.

  model       `RetrievalModel`: query and candidate embeddings; its
              `per_example_loss` wires the parts below
  task        the loss (`InBatchSoftmax`)
  negatives   the negatives a two-tower's softmax scores against
  index       the corpus index (`CorpusIndex`; ScaNN for serving)
  metrics     the corpus hit rates (`CorpusHitRates`, `hit_rates`)
  seen_items  what a user interacted with in training, excluded from
              their top k
  two_tower   `TwoTower`: two MLP towers
  ials        `ImplicitALS`: implicit ALS, its rows solved in closed form
              (`ials_solve`)

`recsys.models` exports the public names (`TwoTower`, `RetrievalModel`,
`CorpusIndex`, ...); `recsys.config.register_all` imports every module
here, so their gin names (`TwoTower`, `ImplicitALS`) are registered.
"""
