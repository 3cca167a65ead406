#!/usr/bin/env bash
# Clone RoDe (Pang et al., PPoPP'24) at the commit the binding was written against, into the
# git-ignored folder benchmarks/peers/third_party/RoDe (or $RODE_DIR). Its code carries no
# license: it is built locally for benchmarking and never copied into this repository.
# $RODE_URL names another source of the same history (a local mirror, where GitHub is out of reach).
# Then `python -m benchmarks.peers.rode --build` compiles the binding into a module a machine
# without the clone or a compiler can run (benchmarks/peers/rode.py).
set -euo pipefail
COMMIT=f446e29802015df3d2fd9cc904f4cbe0cce97f3a
URL="${RODE_URL:-https://github.com/CRAFT-THU/RoDe.git}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${RODE_DIR:-$HERE/third_party/RoDe}"
if [ -d "$DEST/.git" ]; then
    git -C "$DEST" fetch --quiet origin "$COMMIT" || true
else
    mkdir -p "$(dirname "$DEST")"
    git clone --quiet "$URL" "$DEST"
fi
git -C "$DEST" checkout --quiet "$COMMIT"
echo "RoDe at $COMMIT in $DEST"
