# Feeds vramscope's pickles to PyTorch's own memory_viz code paths. flamegraph.pl (which segments/memory
# download) is stood in for by `cat` in ~/.cache: there is no network here, and the folded
# stacks it would draw are what this checks.
import os, sys, pickle, warnings
warnings.filterwarnings("ignore")
import torch
import torch.cuda._memory_viz as mv
print("torch", torch.__version__)
here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
for name in ["own.pickle", "leaky_roundtrip.pickle", "resnet_roundtrip.pickle"]:
    data = pickle.load(open(os.path.join(here, name), "rb"))
    seg, mem = mv.segments(data), mv.memory(data)
    tp, sp = mv.trace_plot(data), mv.segment_plot(data)
    summary = mv.segsum(data)
    print(f"{name}: segments {len(seg.splitlines())} folded lines, memory {len(mem.splitlines())} folded lines, "
          f"trace_plot {len(tp)} chars, segment_plot {len(sp)} chars, segsum {len(summary)} chars")
    if name == "own.pickle":
        print(mem[:400])
