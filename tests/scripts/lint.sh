#!/usr/bin/env bash
# `make lint`, and make test's first check: ruff's rules and format, and mypy over gmd/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${VENV:-.venv}/bin
"$BIN/ruff" check .
"$BIN/ruff" format --check .
"$BIN/mypy" gmd
