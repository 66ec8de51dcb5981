#!/usr/bin/env bash
# The same replay on the sim and on CUDA, alternated, on this host: where the time goes.
set -u
cd "$(dirname "$0")"
# Here: cargo build --release --features cuda -p vramscope-cli && mkdir -p .gpu &&
#   cp target/release/vramscope tests/gpu/sim_vs_cuda.sh .gpu/; then with the `device` tool
#   (carry [".gpu"]): bash .gpu/sim_vs_cuda.sh. Prints: round, trace, backend, kind, median and
#   fastest warm ns/op of 20 warm passes.
for round in 1 2 3; do
  for t in llm_generate_kv speculative_decode lstm_packed resnet_train; do
    for b in sim-cuda cuda; do for seg in virtual malloc; do
      if [ $b = sim-cuda ]; then cfg="--config release_pages:$([ $seg = virtual ] && echo true || echo false)"; else cfg=""; fi
      r=$(VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay ../fixtures/torch/$t.trace.json.gz --backend $b --warm 20 --record off --json $cfg | python3 -c 'import json,sys; r=json.load(sys.stdin); w=sorted(r["warm_ns_per_op"]); print(round(w[len(w)//2],1), round(w[0],1))')
      echo "$round $t $b $seg $r"
    done; done
  done
done
