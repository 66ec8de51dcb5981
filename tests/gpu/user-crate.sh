#!/usr/bin/env bash
# On the device machine: the user-crate fixture's test binaries (fixtures/user-crate, built as
# users build it, here with vramscope's `cuda` feature so that `vramscope::device(0)` is the
# GPU), run as `cargo test` runs them (8 test threads), RUNS times per profile; each run's
# output is saved as $OUT/user-crate-TAG-PROFILE-N.txt (TAG: `default` unless set; set it
# when VRAMSCOPE_CUDA_SEGMENTS is) for `check.py --output` here. Pack, here:
#   cd fixtures/user-crate
#   RUSTFLAGS= cargo test --no-run --features vramscope/cuda
#   RUSTFLAGS= CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
#     cargo test --release --no-run --features vramscope/cuda
#   for p in debug release; do mkdir -p ../../.gpu/user/$p; for t in leaks pins shapes streams tokio_tasks; do
#     cp target/$p/deps/$t-<hash> ../../.gpu/user/$p/$t; done; done   # the newest of each
#   cd ../.. && tar cf - -C .gpu user | xz -T1 -9 > .gpu/user.tar.xz && rm -r .gpu/user
#   (one xz stream with a large window: the binaries share vramscope's debug information, and
#   the five release binaries pack into about 8 MB with their line tables, which the reports need)
#   cp tests/gpu/user-crate.sh .gpu/
# then with the `device` tool (carry [".gpu"]): bash .gpu/user-crate.sh, and here
#   python3 fixtures/user-crate/check.py --output user-crate-*.txt
# PROFILES=release runs only the release binaries (pack only those where the debug ones would
# not fit the 64 MiB the working tree may carry).
# The binaries find the crate (insta's snapshots, the sources their reports name) at the path
# they were built in, /work/main/fixtures/user-crate: the script links /work/main to this
# checkout when it is elsewhere.
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
[ -d "$here/.gpu/user" ] || tar xJf "$here/.gpu/user.tar.xz" -C "$here/.gpu"
[ -e /work/main ] || { mkdir -p /work && ln -s "$here" /work/main; }
cd /work/main/fixtures/user-crate
out="${OUT:-/tmp}"
export VRAMSCOPE_BACKEND="${VRAMSCOPE_BACKEND:-cuda}" RUST_TEST_THREADS=8 RUST_BACKTRACE=0 INSTA_UPDATE=no
for profile in ${PROFILES:-debug release}; do
  for n in $(seq "${RUNS:-3}"); do
    log="$out/user-crate-${TAG:-default}-$profile-$n.txt"
    : > "$log"
    for bin in "$here"/.gpu/user/$profile/*; do
      echo "     Running tests/$(basename "$bin").rs ($bin)" >> "$log"
      timeout 300 "$bin" >> "$log" 2>&1
    done
    echo "${TAG:-default} $profile run $n: $(grep -c '^test .* ok$' "$log") ok, $(grep -c '^test .* FAILED$' "$log") failed"
  done
done
