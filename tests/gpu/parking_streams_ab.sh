#!/bin/bash
# Built as users build: RUSTFLAGS= cargo bench --bench threads --no-run in fixtures/user-bench,
# once at each commit (CARGO_TARGET_DIR apart); the two binaries copied here as threads_base and
# threads_new (strip --strip-debug), then run in one device command.
# A/B of the parking change on the sim backend: base 57e876d vs 38bdd66, interleaved.
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do
    for rec in off default; do
      echo "== round $round $b recording $rec"
      ./threads_$b --threads 1,2,4,8,16 --recording $rec --secs 0.5 2>&1 | grep -v '^{'
    done
  done
done
