#!/usr/bin/env bash
# On the device machine: PyTorch's `max_split_size_mb` (CONF, default max_split_size_mb:128) on
# every fixture trace, through vramscope's CUDA backend with each segment kind, without and
# with the setting (recording off, 5 warm passes), then through PyTorch's caching allocator
# without it, with it, and with it and expandable segments (torch_conf.py, one process each).
# With `vramscope_before` beside it (an earlier build), that build's replays with the setting
# too, on the traces named in BEFORE (a few: it may call the driver hundreds of times a pass).
# Here, first:
#   cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu && cp target/release/vramscope tests/gpu/max_split.sh tests/gpu/torch_conf.py \
#     tests/gpu/pool_pages.py .gpu/
#   strip --strip-debug .gpu/vramscope
# then with the `device` tool (carry [".gpu"]): bash .gpu/max_split.sh > $OUT/log.txt 2>&1, and
# python3 tests/gpu/max_split_table.py log.txt here.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
CONF=${CONF:-max_split_size_mb:128}
BEFORE=${BEFORE:-amp_grad_scaler encoder_serving gpt2_train lstm_packed}
mkdir -p traces && for f in "${TRACES:-../fixtures/torch}"/*.trace.json*; do  # gzipped in the tree
  case $f in *.gz) gunzip -c "$f" > "traces/$(basename "$f" .gz)" ;; *) cp "$f" traces/ ;; esac
done
compact='import json,sys
t=sys.stdin.read()
try:
    r=json.loads(t); r.pop("warm_ns_per_op", None); print(json.dumps(r))
except ValueError: print(t.strip()[-300:])'
for f in traces/*.trace.json; do
  for bin in vramscope vramscope_before; do
    [ -x $bin ] || continue
    for seg in malloc virtual; do
      for conf in "" "$CONF"; do
        if [ $bin = vramscope_before ]; then
          [ -z "$conf" ] && continue
          case " $BEFORE " in *" $(basename $f .trace.json) "*) ;; *) continue ;; esac
        fi
        echo "== replay $(basename $f .trace.json) $bin $seg ${conf:-default}"
        VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./$bin replay "$f" --backend cuda --warm 5 --record off \
          --config "$conf" --json 2>&1 | python3 -c "$compact"
      done
    done
  done
done
echo "== torch_conf.py"
timeout 400 python3 torch_conf.py traces "" "$CONF" "expandable_segments:True,$CONF" 2>&1 | grep -v Warning
