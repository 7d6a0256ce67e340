#!/usr/bin/env bash
# Record one bench/vllm_semantics.py scenario live with `kvtool record` from a loopback
# replay of its .frames (replay_frames.py, 127.0.0.1 only), into tests/data/semantics_more/.
#   bash bench/record_semantics.sh SRC_DIR NAME PORT
set -euo pipefail
src=$1 name=$2 port=$3
here=$(cd "$(dirname "$0")/.." && pwd)
dst=$here/tests/data/semantics_more/$name
mkdir -p "$dst"
n=$(python3 -c "import json;print(json.load(open('$src/truth.json'))['run']['batches'])")
"$here/.venv/bin/kvtool" record "tcp://127.0.0.1:$port" --replay-endpoint "tcp://127.0.0.1:$((port+1))" \
  --groups "$src/groups.json" --max-batches "$n" -o "$dst/$name.mcap" -q &
rec=$!
"$here/.venv/bin/python" /work/shared/tools/replay_frames.py "$src/$name.frames" \
  --endpoint "tcp://127.0.0.1:$port" --replay-endpoint "tcp://127.0.0.1:$((port+1))" \
  --rate 500 --start-delay 1 --linger 3 --quiet
wait $rec
cp "$src/groups.json" "$src/truth.json" "$dst/"
echo "$name: $n batches -> $dst/$name.mcap"
