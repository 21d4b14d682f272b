"""The model dir (`--model_dir`): what a run keeps on disk, and its guards.

One experiment's files: checkpoints, every run's config, the fingerprints
of the files it read, its metrics, its lock. Training, `recsys evaluate`
and `recsys export` reach them only through this package, which sits below
training (it never imports `recsys.training`). Which module owns what:

  run_dir       the layout and the reads and writes (`RunDir`)
  run_files     writing its files without following links
  lock          one training run per folder (`ModelDirLock`)
  run_configs   each run's operative config, and which settings changed
  run_inputs    fingerprints of the files a run reads
  run_checks    what a resume, evaluate or export may not change
  checkpoints   save, resume, damaged checkpoints (`RunCheckpoints`)
  atomic_dir    swapping in a new export directory in one step

The run itself (its strategy, sources, backend, model, restored at a
checkpoint) is `recsys.run`; the process a command runs in,
`recsys.process`.
"""
