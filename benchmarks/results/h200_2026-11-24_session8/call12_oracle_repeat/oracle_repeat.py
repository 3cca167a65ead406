"""Is the selector benchmark's oracle repeatable? Each path timed twice in one process, as
benchmarks/selector.py times it (measure_paths), for every suite graph under 1M nonzeros; a pair
'agrees' when pass 1's fastest path is within 5% of pass 2's fastest."""
import sys, json, os, statistics
import torch
sys.path.insert(0, "benchmarks")
import selector as bench
from common import rotation_count

torch.set_float32_matmul_precision("high")
names = [n for n in bench.graph_names() if not n.startswith(("rmat", "sbm", "uniform_1M"))]
out, agree = [], {}
for name in names:
    a32 = bench.load_graph(name)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = a32 if dtype == torch.float32 else a32.to(dtype)
        for n in (32, 128):
            xs = [(torch.randn(a.shape[1], n, device="cuda", dtype=dtype),) for _ in range(rotation_count(a.shape[1] * n * dtype.itemsize))]
            t1 = bench.measure_paths(a, xs, 20)
            t2 = bench.measure_paths(a, xs, 20)
            best1 = min(t1, key=t1.get)
            ok = t2[best1] <= 1.05 * min(t2.values())
            agree.setdefault(str(dtype), []).append(ok)
            out.append({"graph": name, "dtype": str(dtype), "n": n, "pass1": t1, "pass2": t2, "agree": ok})
            if not ok:
                print(f"{name:26} {str(dtype):15} N={n:3} pass1 best {best1} {t1[best1]:.1f}; pass2 {t2[best1]:.1f} vs best {min(t2, key=t2.get)} {min(t2.values()):.1f}", flush=True)
    del a32
    torch.cuda.empty_cache()
for k, v in agree.items():
    print(f"{k}: pass 1's fastest within 5% of pass 2's fastest on {sum(v)} of {len(v)} pairs")
os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "out"), "oracle_repeat.json"), "w"), indent=1)
