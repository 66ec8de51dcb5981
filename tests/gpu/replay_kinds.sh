#!/usr/bin/env bash
# On the device machine: each trace in DIR (default: traces/) replayed on CUDA and on the sim
# deciding as CUDA does (`--backend sim-cuda`), with virtual segments (the default) and
# `cuMemAlloc` ones, recording off, WARM warm passes (default 6): one line per replay,
#   BACKEND KIND TRACE PEAK_RESERVED/PEAK_LIVE WARM_CALLS_PER_PASS PEAK_RESERVED_BYTES
# then how many CUDA rows the sim gave exactly (the ratio to 4 decimals, every pass's calls).
# Here, first:
#   cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu/rk/traces && cp target/release/vramscope tests/gpu/replay_kinds.sh .gpu/rk/ &&
#   strip --strip-debug .gpu/rk/vramscope && cp TRACES .gpu/rk/traces/
# then with the `device` tool (carry [".gpu"]): bash .gpu/rk/replay_kinds.sh > $OUT/log.txt 2>&1.
set -u
cd "$(dirname "$0")"
DIR=${DIR:-traces}
WARM=${WARM:-6}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for seg in virtual malloc; do
  pages=$([ $seg = virtual ] && echo true || echo false)
  for f in "$DIR"/*; do
    for b in cuda sim-cuda; do
      # The sim's kind is its configuration; CUDA's, the variable.
      cfg=$([ $b = sim-cuda ] && echo "--config release_pages:$pages")
      VRAMSCOPE_CUDA_SEGMENTS=$seg ./vramscope replay "$f" --backend $b --warm "$WARM" --json \
        --record off $cfg 2>&1 | B=$b SEG=$seg F="$f" python3 -c '
import json, os, sys
t = sys.stdin.read()
b, seg, f = os.environ["B"], os.environ["SEG"], os.path.basename(os.environ["F"]).split(".")[0]
try:
    r = json.loads(t)
    calls = "/".join(map(str, r["warm_device_calls"]))
    print(b, seg, f, round(r["fragmentation"], 4), calls, r["peak_reserved_bytes"])
except ValueError:
    print(b, seg, f, "ERROR", " ".join(t.split())[:300])'
    done
  done
done | tee rows.txt
python3 - rows.txt <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    p = line.split()
    rows.setdefault((p[1], p[2]), {})[p[0]] = p[3:5]
same = sum(1 for r in rows.values() if r.get("cuda") is not None and r.get("cuda") == r.get("sim-cuda"))
print(f"{same} of {len(rows)} CUDA rows as the sim gave them")
PY
