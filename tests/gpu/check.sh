#!/usr/bin/env bash
# The prepared GPU check (docs/tracing.md, "Collectives"): run it where CUDA is. Wheels of jobtrace's own
# dependencies that the machine lacks can travel in .whl/ (tests/gpu/README.md); they are installed first.
set -euo pipefail
cd "$(dirname "$0")/../.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 JOBTRACE_NATIVE=${JOBTRACE_NATIVE:-0}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 tests/gpu/check.py "$@"
