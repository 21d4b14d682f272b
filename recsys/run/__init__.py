"""A run without its loop: its parts, restored, and what reads them.

What `recsys evaluate`, `recsys export` and the Trainer share: the
gin-configured `train` (`configured`: a `ConfiguredRun` of the gin
settings), the strategy (`strategy`), how steps compile (`compile`), the
embedding backend built from the settings (`embedding_backend`), the
learning-rate schedules bound to the step (`schedules`), the one
distribution of a source's batches (`input`, `eval_padding`), the
restored run itself (`restored`: `RestoredRun`), its evaluation
(`evaluation`: `Evaluator`), and what a run reports (`run_summaries`,
`memory_peaks`). The training loop, its controller and the Trainer are
`recsys.training`, above this package: nothing here imports it
(tests/test_layering.py). What a run keeps on disk is `recsys.model_dir`;
the process a command runs in, `recsys.process`.
"""
