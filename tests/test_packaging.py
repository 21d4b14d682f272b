"""The installed package: a wheel in a fresh venv, used from another folder;
and the CPU that CI's run prints before the tests.

The wheel must carry the experiment gin files; a user's own gin file outside
the repo includes a shipped experiment by name, and `include` resolves
relative to the including file first.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# No PYTHONPATH: the repo (or a worktree) on it would shadow the wheel.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(args, cwd, env=None, timeout=600):
  done = subprocess.run(
    args,
    cwd=cwd,
    env=env or CLEAN_ENV,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
  return done


@pytest.mark.slow  # ~40 s: builds a wheel, makes a venv, trains 4 steps
def test_wheel_in_a_fresh_venv_trains_a_users_gin_file_from_elsewhere(tmp_path):
  wheels, venv, work = tmp_path / "wheels", tmp_path / "venv", tmp_path / "work"
  # Built from a copy: the build leaves build/ and *.egg-info behind.
  src = tmp_path / "src"
  anywhere = shutil.ignore_patterns("*.egg-info", "__pycache__")
  top_level = {
    ".git",
    ".venv",
    "runs",
    "data",
    "build",
    ".pytest_cache",
    ".hypothesis",
  }
  shutil.copytree(
    ROOT,
    src,
    symlinks=True,
    ignore=lambda d, names: (
      set(anywhere(d, names)) | (top_level & set(names) if d == ROOT else set())
    ),
  )
  _run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--no-deps",
      "-q",
      "-w",
      str(wheels),
      str(src),
    ],
    cwd=tmp_path,
  )
  _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
  python = venv / "bin" / "python"
  wheel = next(wheels.glob("recsys-*.whl"))
  _run(
    [
      sys.executable,
      "-m",
      "pip",
      "--python",
      str(python),
      "install",
      "--no-deps",
      "--no-index",
      "-q",
      str(wheel),
    ],
    cwd=tmp_path,
  )
  # Dependencies (TensorFlow, ...) then come from this environment, by path:
  # no download, and no editable install of the repo (its .pth is not run).
  site = _run(
    [
      str(python),
      "-c",
      "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ],
    cwd=tmp_path,
  ).stdout.strip()
  with open(
    os.path.join(site, "deps_from_test_env.pth"), "w", encoding="utf-8"
  ) as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")

  env = dict(CLEAN_ENV, TF_CPP_MIN_LOG_LEVEL="3", RECSYS_FUSED_KERNELS="0")
  recsys = str(venv / "bin" / "recsys")
  work.mkdir()
  where = _run(
    [str(python), "-c", "import recsys; print(recsys.__file__)"],
    cwd=work,
    env=env,
  )
  assert where.stdout.startswith(site), where.stdout

  listed = _run([recsys, "experiments"], cwd=work, env=env).stdout
  for name in ("synthetic_dlrm.gin", "base.gin", "hardware/cpu_small.gin"):
    assert name in listed
  printed = _run(
    [recsys, "experiments", "synthetic_dlrm.gin"], cwd=work, env=env
  ).stdout
  assert "include 'base.gin'" in printed

  # The user's files live elsewhere; cfg/sub/tiny.gin includes its sibling.
  (tmp_path / "cfg" / "sub").mkdir(parents=True)
  (tmp_path / "cfg" / "my.gin").write_text(
    "include 'synthetic_dlrm.gin'\ninclude 'sub/tiny.gin'\n"
  )
  (tmp_path / "cfg" / "sub" / "tiny.gin").write_text(
    "include 'steps.gin'\n"
    + textwrap.dedent("""
      train.global_batch_size = 32
      train.eval_steps = 2
      train.summaries = False
      SyntheticCTR.oracle_examples = 2048
      """)
  )
  (tmp_path / "cfg" / "sub" / "steps.gin").write_text(
    "train.train_steps = 4\ntrain.steps_per_loop = 2\n"
  )
  _run(
    [
      recsys,
      "train",
      "--gin_file",
      "../cfg/my.gin",
      "--model_dir",
      "run",
      "--no_progress",
    ],
    cwd=work,
    env=env,
  )
  metrics = json.loads((work / "run" / "metrics.json").read_text())
  assert metrics["step"] == 4 and metrics["global_batch_size"] == 32


def _cpu_info(path_env):
  done = subprocess.run(
    ["bash", os.path.join(ROOT, ".ci", "cpu_info")],
    env=dict(CLEAN_ENV, PATH=path_env),
    capture_output=True,
    text=True,
    timeout=30,
  )
  assert done.returncode == 0, done.stderr
  return done.stdout.splitlines()


def test_ci_prints_the_cpu_it_runs_on_with_or_without_lscpu(tmp_path):
  """.ci/run prints the CPU before the tests (.ci/cpu_info): its model,
  family/model numbers, cores, L3 and numerics flags; where lscpu is
  missing (a PATH holding every other command it uses) too."""
  without_lscpu = tmp_path / "bin"
  without_lscpu.mkdir()
  for tool in ("bash", "sed", "head", "cat", "tr", "nproc", "getconf"):
    found = shutil.which(tool)
    if found:
      os.symlink(found, without_lscpu / tool)
  runs = [_cpu_info(os.environ["PATH"]), _cpu_info(str(without_lscpu))]
  for lines in runs:
    assert [line.split(":")[0] for line in lines] == [
      "cpu",
      "cpu",
      "cpu flags for numerics",
    ], lines
    assert re.match(r"cpu: \d+ core\(s\) available, L3 \S", lines[1]), lines
  if not os.path.isfile("/proc/cpuinfo"):
    return
  with open("/proc/cpuinfo", encoding="utf-8") as f:
    info = dict(
      (k.strip(), v.strip())
      for k, _, v in (line.partition(":") for line in f)
      if v
    )
  flags = set(info.get("flags", "").split())
  want = sorted(
    f
    for f in flags
    if f in ("avx", "avx2", "fma") or f.startswith(("avx512", "amx"))
  )
  for lines in runs:
    assert lines[0] == (
      f"cpu: {info['model name']} (family {info['cpu family']}, model "
      f"{info['model']}, stepping {info['stepping']})"
    )
    printed = lines[2].split(": ", 1)[1].split()
    assert sorted(printed) == want or (not want and "none of" in lines[2])
  assert "?" not in runs[1][1], runs[1]  # L3 from sysfs without lscpu
