#!/usr/bin/env bash
# On the device machine's 16 cores (no GPU used): the parking tests 20 times, the loom model
# and the invariants once, then the threads bench of fixtures/user-bench on the sim backend
# (the allocator alone) before and after a change to parking, alternating, three rounds
# (65 s). Stage .gpu with this script as go.sh and the test binaries `allocator` and
# `park_loom` (`cargo test --release --test allocator --test park_loom --no-run`) and
# `threads_old`, `threads_new` (`RUSTFLAGS= cargo bench --bench
# threads --no-run` in fixtures/user-bench, in a worktree of each commit), debug sections
# compressed (`objcopy --compress-debug-sections`); run `bash .gpu/go.sh > $OUT/log.txt`.
cd "$(dirname "$0")"
nproc; lscpu | grep -m1 "Model name"
for i in $(seq 20); do ./allocator parking:: -q 2>&1 | grep "test result"; done | sort | uniq -c
./park_loom -q 2>&1 | grep "test result"
./allocator invariants:: -q 2>&1 | grep "test result"
for round in 1 2 3; do
  for v in old new; do
    for r in off default; do
      ./threads_$v --threads 1,2,4,8,16 --recording $r --secs 0.5 2>&1 | grep -E "^(off|default)," | sed "s/^/$v r$round: /"
    done
  done
done
