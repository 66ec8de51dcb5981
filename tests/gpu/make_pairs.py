# Writes traces of 50,000 alternating alloc/free pairs of one size: replayed, their ns/op is half
# the cost of a cached alloc+free pair.
import json, sys
out = sys.argv[1] if len(sys.argv) > 1 else "."
for b in (512, 1 << 20, 64 << 20):
    ev = []
    for _ in range(50000):
        ev.append(["a", 1, b, 0])
        ev.append(["f", 1, b, 0])
    json.dump({"events": ev}, open(f"{out}/pair_{b}.json", "w"), separators=(",", ":"))
