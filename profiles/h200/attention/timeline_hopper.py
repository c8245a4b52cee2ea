"""Where a Hopper CTA's time goes: the kernel built with %globaltimer stamps at its phase boundaries.

    python3 profiles/h200/attention/timeline_hopper.py build LIB.so      # here: patch + nvcc (no GPU)
    python3 profiles/h200/attention/timeline_hopper.py run LIB.so OUTDIR  # on the H200

`build` compiles kernels/attention/hopper_mla.cu with one thread of each warpgroup writing the global
timer (ns) into a __device__ table at the points of STAMPS, plus a C function that copies the table
out; the shipped source is not touched. `run` loads that library in place of the built one, makes
one cold-L2 call per shape (after warm-up calls), and reports per phase the median over CTAs of its
time since the earliest CTA started, next to the call's CUPTI kernel time. The stamps cost a few
instructions each, so the variant is for the breakdown, not for timing the shipped kernel.
Writes OUTDIR/timeline.csv and prints the table last.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "kernels" / "attention" / "hopper_mla.cu"
MAX_CTAS = 4096
# (name, where the stamp goes: after this text if it ends a line, else before it; the thread that writes it)
STAMPS = [
    ("entry", "  Work w;\n", "threadIdx.x == 0"),
    ("prologue", "  // Roles: each is one branch of a single if/else, as setmaxnreg requires.\n", "threadIdx.x == 0"),
    ("block0_landed", "    cp_async_wait_all();\n    fence_proxy_async();  // cp.async writes (generic proxy) are read by wgmma (async proxy)\n",
     "threadIdx.x == 0 && b == 0"),
    ("s0_first_full", "    wait_stage(sm, b);\n\n", "threadIdx.x == 128 && b == 0"),
    ("s0_loop_done", "  // Whole row sums (the quad's 4 threads) to consumer 1", "threadIdx.x == 128"),
    ("s0_written", "  write_result(p, w, rows, o, 0, l_all, m_run, true, staged_partial(sm.base, 0, w.num_blocks));\n",
     "threadIdx.x == 128"),
    ("pv_written", "  write_result(p, w, rows, o, 1, l_all, unused_m, false, staged_partial(sm.base, 1, w.num_blocks));\n",
     "threadIdx.x == 256"),
]
SHAPES = [(64, 1, 32), (64, 8, 16), (64, 8, 8), (128, 1, 16), (128, 4, 8), (128, 8, 8), (128, 128, 1)]


def build(out: str) -> None:
    src = SOURCE.read_text()
    table = (f"__device__ unsigned long long g_timeline[{MAX_CTAS}][{len(STAMPS)}];\n"
             "__device__ __forceinline__ void stamp(int k) {\n"
             "  unsigned long long t;\n"
             "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
             "  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n"
             f"  if (cta < {MAX_CTAS}) g_timeline[cta][k] = t;\n"
             "}\n")
    anchor = "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\nconstexpr int kCkvChunks"
    assert src.count(anchor) == 1, "the table's anchor moved"
    src = src.replace(anchor, table + anchor)
    for k, (name, anchor, who) in enumerate(STAMPS):
        assert src.count(anchor) == 1, f"stamp {name}: anchor not found once"
        line = f"  if ({who}) stamp({k});\n"
        src = src.replace(anchor, anchor + line if anchor.endswith("\n") else line + anchor)
    src += ("\nextern \"C\" int dsa_hopper_mla_timeline(void* host, int bytes) {\n"
            "  return cudaMemcpyFromSymbol(host, hopper_mla::g_timeline, bytes);\n}\n")
    patched = Path(out).with_suffix(".cu")
    patched.write_text(src)
    subprocess.run(["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-O3", "-lineinfo", "--shared", "-Xcompiler",
                    "-fPIC", "-I", str(SOURCE.parent), "-o", out, str(patched)], check=True)
    print(f"built {out}")


def run(lib_path: str, out: str) -> None:
    import torch

    from dsactl.bench.timing import L2Flusher, measure, pick_method
    from dsactl.definitions import get
    from dsactl.kernels.attention import hopper_mla
    from dsactl.workloads import make_inputs

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_hopper import caller, workload
    from bench_old_vs_new import write_csv

    lib = hopper_mla.bind(ctypes.CDLL(lib_path))
    hopper_mla._library = lambda: lib
    flusher = L2Flusher()
    method = pick_method()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [s[0] for s in STAMPS]
    rows = []
    for fp8 in (False, True):
        for heads, tokens, splits in SHAPES:
            w = workload(heads, tokens, fp8)
            d = get(w.definition)
            inputs = make_inputs(w, "cuda", 0)
            outputs = d.allocate_outputs(d.check_inputs(inputs), "cuda")
            call = caller(hopper_mla.sparse_mla_attention, inputs, outputs, fp8, num_splits=splits)
            cupti_us = statistics.median(measure(call, method, 10, 2, flusher)[1])
            ctas = heads // 64 * splits * tokens
            table = (ctypes.c_ulonglong * (MAX_CTAS * len(STAMPS)))()
            flusher.flush()
            torch.cuda.synchronize()
            call()
            torch.cuda.synchronize()
            assert lib.dsa_hopper_mla_timeline(table, ctypes.sizeof(table)) == 0
            stamps = [[table[c * len(STAMPS) + k] for k in range(len(STAMPS))] for c in range(min(ctas, MAX_CTAS))]
            t0 = min(s[0] for s in stamps)
            row = {"heads": heads, "tokens": tokens, "kv": "fp8" if fp8 else "bf16", "splits": splits, "ctas": ctas,
                   "cupti_us": round(cupti_us, 2)}
            for k, name in enumerate(names):
                row[name] = round(statistics.median((s[k] - t0) / 1e3 for s in stamps), 2)
            row["last_start"] = round((max(s[0] for s in stamps) - t0) / 1e3, 2)
            row["last_end"] = round((max(max(s[5], s[6]) for s in stamps) - t0) / 1e3, 2)
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            write_csv(out_dir / "timeline.csv", rows)
    print("\nmedian over CTAs, us since the first CTA started (cupti: the whole call)")
    print(" ".join(f"{h:>10}" for h in rows[0]))
    for r in rows:
        print(" ".join(f"{str(v):>10}" for v in r.values()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build(sys.argv[2])
    elif sys.argv[1:2] == ["run"]:
        run(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
