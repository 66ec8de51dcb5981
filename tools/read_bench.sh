#!/usr/bin/env bash
# Times every report over big PyTorch pickles, beside Python's pickle.load of the same file,
# in one run: the table of "Reading snapshots" in BENCHMARKS.md.
#
#   python3 tools/big_pickles.py 300 /tmp/big300      # makes the two pickles
#   bash tools/read_bench.sh /tmp/big300 > /tmp/read300.md
#
# Each figure is one run of `/usr/bin/time -f "%e s %M KB"` on a release build
# (`cargo build --release -p vramscope-cli`); gzipped copies (`gzip -1`) are made beside the
# pickles on first use.
set -euo pipefail
dir=${1:?usage: read_bench.sh DIR (holding the pickles tools/big_pickles.py wrote)}
bin=${VRAMSCOPE:-target/release/vramscope}
kinds=(default python)
timed() { # prints "SECONDS s, MEMORY" for a command, its output discarded
    /usr/bin/time -o /tmp/read_bench.time -f "%e %M" "$@" > /dev/null 2> /dev/null || true
    awk '{ printf "%.2f s, %.2f GB", $1, $2 / 1048576 }' /tmp/read_bench.time
}
for k in "${kinds[@]}"; do
    f="$dir/kv_cache_never_reset.$k.pickle"
    [ -f "$f.gz" ] || gzip -1 -k "$f"
done
entries() {
    python3 - "$1" <<'PY'
import pickle, sys
with open(sys.argv[1], "rb") as f:
    s = pickle.load(f)
print(sum(len(t) for t in s["device_traces"]))
PY
}
printf '| command | default stacks | Python stacks |\n|---|---|---|\n'
for cmd in summary live leaks segments folded flamegraph timeline; do
    row="| \`$cmd\` |"
    for k in "${kinds[@]}"; do
        f="$dir/kv_cache_never_reset.$k.pickle"
        if [ "$cmd" = flamegraph ] || [ "$cmd" = timeline ]; then
            row="$row $(timed "$bin" "$cmd" "$f" -o /tmp/read_bench.svg) |"
        else
            row="$row $(timed "$bin" "$cmd" "$f") |"
        fi
    done
    echo "$row"
done
row='| `summary` of the gzipped file |'
for k in "${kinds[@]}"; do row="$row $(timed "$bin" summary "$dir/kv_cache_never_reset.$k.pickle.gz") |"; done
echo "$row"
row="| Python's \`pickle.load\` alone |"
for k in "${kinds[@]}"; do
    row="$row $(timed python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1],"rb"))' "$dir/kv_cache_never_reset.$k.pickle") |"
done
echo "$row"
row='| entries |'
for k in "${kinds[@]}"; do row="$row $(entries "$dir/kv_cache_never_reset.$k.pickle") |"; done
echo "$row"
