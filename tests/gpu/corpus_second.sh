#!/usr/bin/env bash
# On the device machine: records the second leak corpus (fixtures/torch/corpus/programs2.py)
# with Python stacks and the ground truth, then with PyTorch's default recording, packed into
# $OUT/corpus2.tgz (the device returns a limited number of files). 27 s on an
# H200. Copy this script into .gpu and run `bash .gpu/corpus_second.sh > $OUT/log.txt`.
set -u
cd "$(dirname "$0")/../fixtures/torch/corpus"
dir=$(mktemp -d)
t0=$(date +%s)
PROGRAMS=programs2 OUT=$dir/python timeout 280 python3 record.py 24 2>&1 | grep -v Warning
PROGRAMS=programs2 STACKS=default OUT=$dir/default timeout 200 python3 record.py 24 2>&1 | grep -v Warning
echo "total $(( $(date +%s) - t0 )) s"
tar -C "$dir" -czf "$OUT/corpus2.tgz" .
