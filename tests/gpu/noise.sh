#!/usr/bin/env bash
# Where the warm-time noise comes from: the same replay (virtual segments, recording off) run
# again and again, back to back, after a sleep, and pinned to one CPU, each warm pass printed.
# Copy the CLI into .gpu/ as run.sh says, then: bash .gpu/noise.sh > $OUT/noise.txt 2>&1.
set -u
cd "$(dirname "$0")"
nproc; lscpu | grep -iE "model name|numa|socket|thread|MHz" ; cat /proc/loadavg
mkdir -p traces && for f in ../fixtures/torch/*.trace.json.gz; do gunzip -c "$f" > "traces/$(basename "$f" .gz)"; done
run() { local t=$1 tag=$2; shift 2
  r=$(VRAMSCOPE_CUDA_SEGMENTS=virtual timeout 60 "$@" ./vramscope replay traces/$t.trace.json --backend cuda --warm 9 --record off --json)
  python3 -c "import json,sys; r=json.loads(sys.argv[1]); print('%-22s %-10s med %6.1f cold %8.1f passes %s'%(sys.argv[2],sys.argv[3],r['ns_per_op'],r['cold_ns_per_op'],' '.join('%.0f'%x for x in r['warm_ns_per_op'])))" "$r" $t "$tag"
}
for t in leaky_train amp_grad_scaler encoder_serving unet_diffusion grad_accum_checkpoint; do
  VRAMSCOPE_CUDA_SEGMENTS=malloc ./vramscope replay traces/$t.trace.json --backend cuda --warm 5 --record fast --json >/dev/null
  for i in 1 2 3; do run $t seq$i; done
  sleep 3; run $t slept
  for c in 0 3 8 13; do run $t cpu$c taskset -c $c; done
done
cat /proc/loadavg
