"""Synthetic traces of random shapes, most on several streams: steps whose sizes
scale by a random factor, each allocation on a random stream, some freed at once. Seeds whose
`seed % 6` is 3 to 5 use 2 to 4 streams. Writes OUT/tSEED.trace.json for seeds FROM..TO:
  OUT=/tmp/gen python3 tests/gpu/random_streams.py 0 24
then `vramscope replay /tmp/gen/t3.trace.json --backend sim-cuda --warm 3 --json` shows what a
CUDA replay decides (BENCHMARKS.md, "Random shapes on several streams")."""
import os
import json, random, sys
def trace(seed):
    r = random.Random(seed)
    kind = seed % 6
    ev = []; live = {}; addr = [1 << 20]
    def alloc(size, stream=0):
        a = addr[0]; addr[0] += size + 512
        live[a] = (size, stream); ev.append(["a", a, size, stream]); return a
    def free(a):
        s, st = live.pop(a); ev.append(["f", a, s, st])
    streams = [0] if kind < 3 else [0, 1, 2, 3][: 2 + seed % 3]
    steps = r.randint(6, 20)
    keep = []
    for step in range(steps):
        scale = r.choice([0.3, 0.6, 1.0, 1.5, 2.5]) if kind in (1, 4) else 1.0
        n = r.randint(30, 200)
        acts = []
        for i in range(n):
            if kind == 2:
                size = int(2 ** r.uniform(9, 30))
            else:
                size = int(r.choice([512, 4096, 65536, 1 << 20, 3 << 20, 16 << 20, 50 << 20, 200 << 20]) * scale * r.uniform(0.5, 1.5))
            size = max(1, size)
            st = r.choice(streams)
            acts.append(alloc(size, st))
            if acts and r.random() < 0.4:
                free(acts.pop(r.randrange(len(acts))))
        for a in acts:
            if r.random() < 0.02:
                keep.append(a)
            else:
                free(a)
    for a in keep:
        free(a)
    return {"events": ev}
for s in range(int(sys.argv[1]), int(sys.argv[2])):
    json.dump(trace(s), open(os.path.join(os.environ.get("OUT", "."), f"t{s}.trace.json"), "w"))
