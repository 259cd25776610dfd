#!/usr/bin/env bash
# Run the test suite (what CI runs): make sure the machine is set up, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-bench
exec "${PYTHON:-python3}" -m pytest -q -ra tests "$@"
