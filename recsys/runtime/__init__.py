"""How a `recsys` command's process runs, apart from its flags.

  threads   TensorFlow's intra-/inter-op threads for this machine's cores
  startup   logging, TensorFlow's quiet start, devices and threads, once
  exits     the exit status of an error or a signal (SIGTERM 143, Ctrl-C
            130), and SIGTERM before the training loop takes it over

None of these imports TensorFlow at import time: `recsys.cli` uses them
before TensorFlow starts (a misspelt flag or gin file is refused in < 1 s).
"""
