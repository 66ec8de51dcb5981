#!/usr/bin/env bash
# On the device machine: the smallest memory each fixture trace fits in. vramscope, each segment
# kind, on the GPU with `--capacity` (the most the allocator may reserve) at what `fit_sim.py`
# found on the sim: the smallest capacity that ran (it should run here) and the largest that ran
# out of memory (it should fail here); then PyTorch's caching allocator, without and with
# expandable segments, by bisection with `set_per_process_memory_fraction` (torch_conf.py,
# FIT=1). Here, first:
#   cargo build --release --features cuda -p vramscope-cli
#   TOTAL=<the GPU's bytes> python3 tests/gpu/fit_sim.py target/release/vramscope \
#     fixtures/torch/*.trace.json.gz > fit-sim.jsonl
#   mkdir -p .gpu && cp target/release/vramscope fit-sim.jsonl tests/gpu/fit.sh \
#     tests/gpu/torch_conf.py tests/gpu/pool_pages.py .gpu/ && strip --strip-debug .gpu/vramscope
# then with the `device` tool (carry [".gpu"]): bash .gpu/fit.sh > $OUT/log.txt 2>&1, and
# python3 tests/gpu/fit_table.py log.txt here.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p traces && for f in "${TRACES:-../fixtures/torch}"/*.trace.json*; do  # gzipped in the tree
  case $f in *.gz) gunzip -c "$f" > "traces/$(basename "$f" .gz)" ;; *) cp "$f" traces/ ;; esac
done
short='import json,sys
t=sys.stdin.read()
try:
    r=json.loads(t); print(json.dumps({k: r[k] for k in ("peak_live_bytes", "peak_reserved_bytes", "warm_device_calls")}))
except ValueError: print(json.dumps({"error": t.strip()[-400:]}))'
python3 -c 'import json,sys
for l in open("fit-sim.jsonl"):
    r = json.loads(l)
    print(r["trace"], "virtual" if r["pages"] else "malloc", r["fits"], r["fails"])' > fit-jobs.txt
while read -r trace seg fits fails; do
  for cap in "$fits" "$fails"; do
    echo "== fit $trace $seg $cap"
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay "traces/$trace.trace.json" --backend cuda \
      --warm 2 --record off --capacity "$cap" --json 2>&1 | python3 -c "$short"
  done
done < fit-jobs.txt
echo "== torch_conf.py FIT=1"
FIT=1 timeout 450 python3 torch_conf.py traces "" "expandable_segments:True" 2>&1 | grep -v Warning
