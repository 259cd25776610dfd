#!/usr/bin/env bash
# Run the test suite (what CI runs): make sure the machine is set up, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-bench --test-ops
# Two workers (pytest-xdist): most of the suite is real training runs, each a fresh process whose start-up
# (imports, engine set-up) keeps one core busy, so two side by side take about 60% of the time one after the other.
# TEST_WORKERS=0 runs everything in this process (e.g. for a debugger).
exec "${PYTHON:-python3}" -m pytest -q -ra -n "${TEST_WORKERS:-2}" --dist worksteal tests "$@"
