"""Side-by-side H200 timing of attention kernel sets: the checkout against saved copies.

    python3 profiles/h200/attention/bench_sets.py OUTDIR [--tokens 1,2,...] [--no-contest] [--hopper NAME]
        NAME=DIR [NAME=DIR ...]

A set is a directory with triton_sparse_mla.py and, optionally, hopper_mla.py with its build
libhopper_mla.so: the Hopper launcher then takes that set's Triton module (its split partials and
combine) and that library, so sets that change the partials' format compare whole. The set "new"
is the checkout (kernels/attention, build/sm90a). Two Hopper libraries cannot launch from one
process (bench_builds.sh), so only the set --hopper names (default new) runs its Hopper launcher:
run the script once per Hopper set. Per shape every set runs on the same inputs,
in order new, the others, new again (new's figure is the median of both, their gap new_spread_us),
with bench's method (CUPTI kernel time summed over the call's launches, cold L2, median
of ITERS). Each output is checked against the definition's reference (verify's rules: max abs
error and pass/fail), so a set that computes something else shows up.

Shapes: the contest attention workloads (Triton, the 16-head dispatch) and 64/128 heads x bf16/FP8
KV x TOKENS or --tokens (Triton and Hopper). Writes OUTDIR/sets-hopper_NAME.csv; prints
a table.
"""

from __future__ import annotations

import csv
import ctypes
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_old_vs_new as bo  # noqa: E402  (workloads, timing, module loading)

from dsactl.bench.timing import L2Flusher, pick_method  # noqa: E402
from dsactl.definitions import get  # noqa: E402
from dsactl.kernels.attention import hopper_mla, triton_sparse_mla  # noqa: E402
from dsactl.verify.rules import Tolerance, compare_close  # noqa: E402
from dsactl.workloads import suite  # noqa: E402

TOKENS = "1,2,4,8,32,128"


class KernelSet:
    def __init__(self, name: str, triton_module, hopper_module=None):
        self.name, self.triton, self.hopper = name, triton_module, hopper_module


def load_set(name: str, directory: str, with_hopper: bool) -> KernelSet:
    d = Path(directory)
    tsm = bo.load_old(str(d / "triton_sparse_mla.py"))
    hopper = None
    if with_hopper:
        hopper = bo.load_old(str(d / "hopper_mla.py"))
        library = hopper.bind(ctypes.CDLL(str((d / "libhopper_mla.so").resolve())))
        hopper.tsm = tsm
        hopper._library = lambda: library
    return KernelSet(name, tsm, hopper)


def main(out: str, args: list[str]) -> None:
    def option(flag: str, default: str) -> str:
        return args[args.index(flag) + 1] if flag in args else default

    tokens_list = [int(t) for t in option("--tokens", TOKENS).split(",")]
    hopper_set = option("--hopper", "new")
    specs = [a.split("=", 1) for a in args if "=" in a]
    sets = [KernelSet("new", triton_sparse_mla, hopper_mla if hopper_set == "new" else None)]
    sets += [load_set(name, directory, name == hopper_set) for name, directory in specs]
    if not any(s.hopper for s in sets):
        sys.exit(f"--hopper {hopper_set}: no such set with a Hopper launcher")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    method, flusher = pick_method(), L2Flusher()
    tol = Tolerance()
    print(f"{torch.cuda.get_device_name()} timing {method}, {bo.ITERS} iters, cold L2; sets "
          + ", ".join(s.name for s in sets), flush=True)

    cases = [("contest", w, "_fp8kv" in w.definition) for w in suite("contest")
             if w.definition.startswith("dsa_sparse_attention") and "--no-contest" not in args]
    cases += [("production", bo.production_workload(h, t, fp8), fp8) for h in (64, 128)
              for t in tokens_list for fp8 in (False, True)]
    rows = []
    for group, w, fp8 in cases:
        inputs, outputs = bo.prepared(w)
        expected = get(w.definition).run_reference(inputs)
        tokens, heads = inputs["q_nope"].shape[:2]
        impls = [("triton", s, s.triton) for s in sets]
        if group == "production":
            impls += [("hopper", s, s.hopper) for s in sets if s.hopper is not None]
        times: dict[tuple[str, str], list[float]] = {}
        # Per implementation: new, the other sets, new again (drift between the two shows in new_spread_us).
        order = [x for impl in dict.fromkeys(i for i, _, _ in impls)
                 for x in [y for y in impls if y[0] == impl] + [y for y in impls if y[0] == impl and y[1].name == "new"]]
        for impl, s, module in order:
            times.setdefault((impl, s.name), []).append(
                bo.time_us(bo.launcher_call(module, inputs, outputs, fp8), method, flusher))
        for impl, s, module in impls:
            for o in outputs.values():
                o.fill_(float("nan"))
            bo.launcher_call(module, inputs, outputs, fp8)()
            torch.cuda.synchronize()
            out_v = compare_close("output", outputs["output"], expected["output"], tol)
            lse_v = compare_close("lse", outputs["lse"], expected["lse"], tol, empty=expected["lse"] == float("-inf"))
            us = times[(impl, s.name)]
            row = {"group": group, "workload": w.uuid, "tokens": tokens, "heads": heads, "kv": "fp8" if fp8 else "bf16",
                   "impl": impl, "set": s.name, "us": round(statistics.median(us), 3),
                   "new_spread_us": round(max(us) - min(us), 3) if len(us) > 1 else "",
                   "out_max_abs_err": f"{out_v.max_abs:.3g}", "lse_max_abs_err": f"{lse_v.max_abs:.3g}",
                   "passed": out_v.passed and lse_v.passed}
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        bo.write_csv(out_dir / f"sets-hopper_{hopper_set}.csv", rows)

    names = [s.name for s in sets]
    print(f"\n{'shape':28s} {'impl':7s} " + " ".join(f"{n:>10s}" for n in names) + "   output max abs err")
    keyed = {(r["workload"], r["impl"], r["set"]): r for r in rows}
    for (workload, impl) in dict.fromkeys((r["workload"], r["impl"]) for r in rows):
        got = [keyed.get((workload, impl, n)) for n in names]
        print(f"{workload[:28]:28s} {impl:7s} " + " ".join(f"{g['us']:10.2f}" if g else f"{'-':>10s}" for g in got)
              + "   " + " ".join(g["out_max_abs_err"] + ("" if g["passed"] else "!") for g in got if g))
    for n in names if any(g == "contest" for g, _, _ in cases) else []:
        c = [keyed[(w.uuid, "triton", n)]["us"] for g, w, _ in cases if g == "contest"]
        print(f"contest {n}: mean {statistics.mean(c):.2f} us, max {max(c):.2f} us")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
