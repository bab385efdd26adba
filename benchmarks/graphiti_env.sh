#!/usr/bin/env bash
# Creates benchmarks/.venv-graphiti: the benchmark-only virtual environment for the tkg vs Graphiti side-by-side
# (benchmarks/bench_graphiti.py). graphiti-core pulls an openai version of its own, so it never shares tkg's
# environment and is never a dependency of tkg. Idempotent: an existing, working venv is left as it is.
#
#   benchmarks/graphiti_env.sh            # create (or check) the venv
#   PYTHON=python3.11 benchmarks/graphiti_env.sh
#
# graphiti-core resolves to 0.31.1 here (0.31.2 needs a newer certifi than the index serves); its LLM client
# imports httpx without declaring it, hence the explicit httpx.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="$HERE/.venv-graphiti"
PY="${PYTHON:-python3}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import graphiti_core, kuzu, httpx, tkg" 2>/dev/null; then
    echo "graphiti venv ready: $VENV"
    exit 0
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e "$ROOT[bench]" "graphiti-core==0.31.1" "kuzu==0.11.3" httpx
"$VENV/bin/python" -c "import graphiti_core, kuzu, httpx, tkg"
echo "graphiti venv created: $VENV"
