"""How a `recsys` command's process runs, apart from its flags.

  threads   TensorFlow's intra-/inter-op threads for this machine's cores
  startup   logging, TensorFlow's quiet start, devices and threads, once
  exits     the exit status of an error or a signal (SIGTERM 143, Ctrl-C
            130), and SIGTERM before the training loop takes it over
  console   what a command shows at each --verbosity (brief, info, debug)

None of these imports TensorFlow at import time: `recsys.cli` uses them
before TensorFlow starts (a misspelt flag or gin file is refused in < 1 s).
Not to be confused with its neighbours: `recsys.run` is a run's objects
(assembled from the settings, restored), `recsys.model_dir` its folder on
disk; this package is the process a command runs in.
"""
