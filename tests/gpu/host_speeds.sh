#!/usr/bin/env bash
# On the device machine: is the host's two-speed behaviour tied to the core, to the process's
# address-space layout (ASLR), or to time? `vramscope replay` of ensemble_streams on the sim
# backend (no GPU call at all) pinned to each core twice, unpinned with and without ASLR, one
# process of 400 passes (its per-pass spread), then on CUDA. Packing: the CLI as users build it
# in .gpu/vramscope, fixtures/torch/ensemble_streams.trace.json.gz in .gpu/multi/, this script
# in .gpu/; then (carry [".gpu"]) bash .gpu/host_speeds.sh > $OUT/host_speeds.txt. Written for
# BENCHMARKS.md, "The host's two speeds are phases".
cd "$(dirname "$0")"
gunzip -c multi/ensemble_streams.trace.json.gz > /tmp/ens.json
r() { "$@" | python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['ns_per_op'],1), end=' ')"; }
echo "== per core, sim, two runs each"
for c in $(seq 0 15); do printf 'core %s: ' $c; r taskset -c $c ./vramscope replay /tmp/ens.json --backend sim --warm 30 --json; r taskset -c $c ./vramscope replay /tmp/ens.json --backend sim --warm 30 --json; echo; done
echo "== unpinned, sim, aslr then no aslr"
for i in $(seq 12); do r ./vramscope replay /tmp/ens.json --backend sim --warm 30 --json; done; echo
for i in $(seq 12); do r setarch x86_64 -R ./vramscope replay /tmp/ens.json --backend sim --warm 30 --json; done; echo
echo "== one process of 400 warm passes: its median, then the spread of its passes"
r ./vramscope replay /tmp/ens.json --backend sim --warm 400 --json; echo
./vramscope replay /tmp/ens.json --backend sim --warm 400 --json | python3 -c "
import json,sys; d=json.load(sys.stdin); w=d['warm_ns_per_op']; print('passes', len(w), 'min', round(min(w)), 'max', round(max(w)), 'deciles', [round(sorted(w)[int(len(w)*q/10)]) for q in range(10)])"
echo "== cuda, unpinned, 8 runs"
for i in $(seq 8); do r ./vramscope replay /tmp/ens.json --backend cuda --warm 30 --json; done; echo
nproc; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>&1 | head -1; grep -m1 MHz /proc/cpuinfo
