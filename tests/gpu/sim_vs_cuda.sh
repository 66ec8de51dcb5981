#!/usr/bin/env bash
# The same replay on the sim and on CUDA, alternated, on this host: where the time goes.
set -u
cd "$(dirname "$0")"
# Here: cargo build --release --features cuda -p vramscope-cli && mkdir -p .gpu &&
#   cp target/release/vramscope tests/gpu/sim_vs_cuda.sh .gpu/; then with the `device` tool
#   (carry [".gpu"]): bash .gpu/sim_vs_cuda.sh. Prints: round, trace, backend, kind, median and
#   fastest warm ns/op of 20 warm passes. TRACES="NAME[:WARM] ..." replays other fixture traces
#   (WARM warm passes, default 20); SKIP=K leaves each replay's first K warm passes out of the
#   median and the fastest (host_speed.sh sets both).
for round in 1 2 3; do
  for spec in ${TRACES:-llm_generate_kv speculative_decode lstm_packed resnet_train}; do
    t=${spec%%:*}; warm=20; [ "$spec" = "$t" ] || warm=${spec#*:}
    for b in sim-cuda cuda; do for seg in virtual malloc; do
      if [ $b = sim-cuda ]; then cfg="--config release_pages:$([ $seg = virtual ] && echo true || echo false)"; else cfg=""; fi
      r=$(VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay ../fixtures/torch/$t.trace.json.gz --backend $b --warm $warm --record off --json $cfg | python3 -c 'import json,sys; r=json.load(sys.stdin); w=sorted(r["warm_ns_per_op"][int(sys.argv[1]):]); print(round(w[len(w)//2],1), round(w[0],1))' "${SKIP:-0}")
      echo "$round $t $b $seg $r"
    done; done
  done
done
