#!/usr/bin/env bash
# On the device machine: views of the range's free pages (`alias_pages`, src/alloc/heap/alias.rs)
# on CUDA. First the CUDA tests (virtual segments, the default, then cuMemAlloc segments;
# parallel, as `cargo test` runs them), then every fixture trace (fixtures/torch/*.trace.json.gz) replayed through vramscope on
# CUDA with virtual segments, without and with views (4 warm passes, recording off, a JSON line
# each after an "== replay NAME virtual CONFIG" line); with `torch` as the first argument,
# instead, the same traces through PyTorch's caching allocator, the cudaMallocAsync pool and
# cudaMalloc (torch_replay.py; a second command: both do not fit in the device's 10 minutes).
# With `builds`: what views cost in the first pass, two builds side by side: after the CUDA
# tests, every trace through `vramscope_a` and `vramscope_b` back to back (virtual segments, the
# default configuration; "== replay NAME A|B" lines; cold_ns_per_op is the first pass), then
# through PyTorch's caching allocator with expandable segments (torch_replay.py with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, whose torch_cold_ns_op is its first pass);
# pack the two CLI builds as vramscope_a (the one to compare with) and vramscope_b, and print the
# table with `python3 tests/gpu/view_costs_table.py LOG`.
# Pack, here:
#   cargo build --release --features cuda -p vramscope-cli
#   cargo test --release --features cuda --test cuda --no-run      # prints the test binary
#   mkdir -p .gpu/al && cp target/release/vramscope ../shared/tools/torch_replay.py \
#     tests/gpu/aliasing.sh .gpu/al/ && cp target/release/deps/cuda-<hash> .gpu/al/cuda_tests
#   strip --strip-debug .gpu/al/vramscope .gpu/al/cuda_tests
# then with the `device` tool (carry [".gpu/al"]): bash .gpu/al/aliasing.sh > $OUT/al.log 2>&1
# and bash .gpu/al/aliasing.sh torch > $OUT/torch.log 2>&1.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
fixtures="$here/../../fixtures/torch"
cd "$here"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
mkdir -p traces
python3 - "$fixtures" <<'PY'
import gzip, os, shutil, sys
for f in sorted(os.listdir(sys.argv[1])):
    if f.endswith(".trace.json.gz"):
        with gzip.open(os.path.join(sys.argv[1], f)) as src, open("traces/" + f[:-3], "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
echo "$(ls traces | wc -l) traces"
if [ "${1:-}" = torch ]; then
  timeout 560 python3 torch_replay.py traces 2>&1 | grep -v Warning
  echo "total $(( $(date +%s) - t0 )) s"
  exit 0
fi
for seg in virtual malloc; do
  [ -x cuda_tests ] || break
  echo "== cuda tests, $seg segments"
  VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 150 ./cuda_tests 2>&1 | grep -E "^test |test result|panicked" | head -40
done
if [ "${1:-}" = builds ]; then
  for f in traces/*.trace.json; do
    for build in a b; do
      [ -x vramscope_$build ] || continue
      echo "== replay $(basename "$f" .trace.json) ${build^^}"
      VRAMSCOPE_CUDA_SEGMENTS=virtual timeout 40 ./vramscope_$build replay "$f" --backend cuda --warm 4 \
        --record off --json 2>&1
    done
  done
  echo "== torch_replay.py, expandable segments"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 300 python3 torch_replay.py traces 2>&1 | grep -v Warning
  echo "total $(( $(date +%s) - t0 )) s"
  exit 0
fi
for f in traces/*.trace.json; do
  for conf in alias_pages:false alias_pages:true; do
    echo "== replay $(basename "$f") virtual $conf"
    VRAMSCOPE_CUDA_SEGMENTS=virtual timeout 40 ./vramscope replay "$f" --backend cuda --warm 4 --record off \
      --config "$conf" --json 2>&1
  done
done
echo "total $(( $(date +%s) - t0 )) s"
