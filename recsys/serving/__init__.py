"""Serving: the trained tables read outside a training step, and the export.

  lookup   a batch in the data contract -> the backend's ids and weights
           (`split_batch`, the training step's too) -> activations, on one
           device with no strategy and no tape (`serving_activations`)
  checks   what every exported signature checks first: shapes, then ids
  export   the SavedModel of a restored run: id and raw-feature signatures

`lookup` and `checks` sit beside the models (training, evaluation and the
export read the tables through `lookup`); `export` sits above the restored
run (`recsys.run`) and below training: nothing here imports
`recsys.training` (tests/test_layering.py).
"""
