"""Read Nsight Compute reports into pandas tables: one row per kernel launch, and
aggregates per (solution, kernel, workload class).

Reads `.ncu-rep` files with NVIDIA's `ncu_report` module: the `ncu-report`
wheel (works without ncu or a GPU), else the copy that ships with ncu under
`extras/python`. Only metrics that `ncu --set roofline --section Occupancy
--section LaunchStats` records are used (and, from a `--ncu warps` report, the
warp-state metrics below), so reports made by hand with that command read the
same as dsactl's. Names as ncu 2025.3 records them on an H200:

  duration      gpu__time_duration.sum
  grid, block   launch__grid_size (CTAs), launch__block_size (threads per CTA)
  registers     launch__registers_per_thread; shared memory launch__shared_mem_per_block
  SMs           launch__sm_count
  active SMs    min(grid, SMs): the CTA scheduler gives every SM a CTA before any SM a second one
  SM %          sm__throughput.avg.pct_of_peak_sustained_elapsed
  L1/TEX %      l1tex__throughput.avg.pct_of_peak_sustained_active
  L2 %          lts__throughput.avg.pct_of_peak_sustained_elapsed
  DRAM %        gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed
  tensor %      sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active
                .avg.pct_of_peak_sustained_elapsed (the tensor pipe's busy share, GH100 name)
  occupancy     sm__warps_active.avg.pct_of_peak_sustained_active (achieved),
                sm__maximum_warps_per_active_cycle_pct (theoretical)
  DRAM bytes    dram__bytes.sum.per_second * duration
  FLOPs         tensor-core FLOPs + FP16/FP32/FP64 SASS FLOPs, see FLOP COUNTING
  warp state    (--ncu warps; '-' in a roofline report)
    stalls      smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio: warps waiting for
                <reason> per issued instruction; the largest three, "selected" (the issue itself) left out
    cycles/issue  smsp__average_warp_latency_per_inst_issued.ratio: the warp cycles an issued instruction
                costs (the reasons, "selected" included, add up to about it)
    issue %     smsp__issue_active.avg.per_cycle_active: the share of cycles a scheduler issues
    instructions  smsp__inst_executed.sum (warp instructions)
    smem conflicts  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum + _op_st.sum

FLOP COUNTING. Rates are per elapsed SM cycle; FLOPs = rate * sm__cycles_elapsed
.avg.per_second * duration, as ncu's own roofline charts compute them.
- Tensor cores: the sum of sm__ops_path_tensor_src_<type>.sum.per_cycle_elapsed
  over floating-point source types (bf16, fp16, tf32, fp64, fp8; the integer
  types are not FLOPs). On sm90 these count wgmma (HGMMA/QGMMA) work as well
  as mma.sync: measured on the H200, a 4096^3 cuBLAS GEMM (nvjet_sm90, wgmma)
  gave src_bf16_dst_fp32 = 2 * 4096^3 in bf16 and src_fp8_sparsity_off =
  2 * 4096^3 in fp8, so one counted op is one FLOP (a multiply-add is 2).
  Where a type is recorded only split by sparsity (fp8 on sm90), the on and
  off halves are summed; where the whole is recorded too, only the whole.
- Everything else: smsp__sass_thread_inst_executed_op_<op>_pred_on.sum
  .per_cycle_elapsed, weighted as ncu's roofline weighs them (FFMA/DFMA 2,
  HFMA2 4, HADD2/HMUL2 2, other adds and multiplies 1).
"""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from dsactl.errors import DsactlError
from dsactl.profile.collect import parse_range_name

SASS_FLOPS = {
    f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed": w
    for op, w in (("ffma", 2), ("fadd", 1), ("fmul", 1), ("dfma", 2), ("dadd", 1), ("dmul", 1),
                  ("hfma", 4), ("hadd", 2), ("hmul", 2))
}
TENSOR_RATE = re.compile(r"^sm__ops_path_tensor_src_(?P<type>[a-z0-9_]+?)(?P<split>_sparsity_(?:on|off))?"
                         r"\.sum\.per_cycle_elapsed$")
INTEGER_TYPES = ("int",)
SM_CYCLES_PER_SECOND = "sm__cycles_elapsed.avg.per_second"

STALL_RATIO = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>[a-z0-9_]+)_per_issue_active\.ratio$")
ISSUE_REASON = "selected"  # the cycle an instruction issues, not a wait
TOP_STALLS = 3
SMEM_CONFLICTS = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                  "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")

COLUMNS = ("solution", "workload", "class", "kernel", "duration_us", "grid", "block", "registers", "smem_kib",
           "sms", "active_sms", "waves", "sm_pct", "l1_pct", "l2_pct", "dram_pct", "tensor_pct", "occupancy_pct",
           "theoretical_occupancy_pct", "tensor_flop", "sass_flop", "flop", "tflops", "dram_bytes", "dram_gbs",
           "intensity", "issue_pct", "cycles_per_issue", "stalls", "instructions", "smem_conflicts", "report")

# column -> metric names, first present wins.
METRICS = {
    "duration_s": ("gpu__time_duration.sum",),
    "grid": ("launch__grid_size",),
    "block": ("launch__block_size",),
    "registers": ("launch__registers_per_thread",),
    "smem": ("launch__shared_mem_per_block",),
    "sms": ("launch__sm_count", "device__attribute_multiprocessor_count"),
    "waves": ("launch__waves_per_multiprocessor",),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "tensor_pct": ("sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active"
                   ".avg.pct_of_peak_sustained_elapsed",),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "dram_bytes_per_s": ("dram__bytes.sum.per_second",),
    "issue_per_cycle": ("smsp__issue_active.avg.per_cycle_active",),
    "instructions": ("smsp__inst_executed.sum",),
    "cycles_per_issue": ("smsp__average_warp_latency_per_inst_issued.ratio",),
    "sm_cycles_per_s": (SM_CYCLES_PER_SECOND,),
    "device": ("device__attribute_display_name",),
    # roofs (per cycle, times the clock they run at)
    "dram_peak_per_cycle": ("dram__bytes.sum.peak_sustained",),
    "dram_cycles_per_s": ("dram__cycles_elapsed.avg.per_second",),
    "ffma_peak_per_cycle": ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained",),
    "bf16_peak_per_cycle": ("sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained",),
    "fp8_peak_per_cycle": ("sm__ops_path_tensor_src_fp8_sparsity_off.sum.peak_sustained",),
}

_UNIT_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_UNIT_BASES = ("s", "second", "byte", "cycle", "hz")


def _unit_scale(unit: str) -> float:
    """Factor to base units (s, B, cycles, Hz) of ncu unit strings such as ns, Kbyte/s, cycle/usecond."""
    scale = 1.0
    for i, part in enumerate(unit.split("/")):
        factor = 1.0
        if part[:1] in _UNIT_PREFIX and part[1:] in _UNIT_BASES:
            factor = _UNIT_PREFIX[part[0]]
        scale = scale * factor if i == 0 else scale / factor
    return scale


def import_ncu_report():
    """The ncu_report module: the ncu-report wheel, else the copy under ncu's extras/python."""
    try:
        import ncu_report

        return ncu_report
    except ImportError:
        pass
    candidates = []
    ncu = shutil.which("ncu")
    if ncu:
        candidates.append(Path(os.path.realpath(ncu)).parent / "extras" / "python")
    candidates += [Path(p) for p in sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"), reverse=True)]
    candidates += [Path(p) for p in sorted(glob.glob("/usr/local/cuda*/nsight-compute*/extras/python"), reverse=True)]
    for folder in candidates:
        if (folder / "ncu_report.py").is_file():
            sys.path.insert(0, str(folder))
            import ncu_report

            return ncu_report
    raise DsactlError("reading .ncu-rep reports needs NVIDIA's ncu_report module: `pip install ncu-report` "
                      "(or install Nsight Compute, which ships it under extras/python)")


def open_report(path: str | Path):
    """The report's context, or a DsactlError saying why it cannot be read."""
    ncu_report = import_ncu_report()
    if not Path(path).is_file():
        raise DsactlError(f"no such report: {path}")
    try:
        return ncu_report.load_report(str(path))
    except Exception as e:  # the module raises plain exceptions for unreadable files
        raise DsactlError(f"cannot read {path} as an Nsight Compute report ({e})") from None


def _value(action, names: tuple[str, ...]) -> Any:
    for name in names:
        m = action.metric_by_name(name)
        if m is None or not m.has_value():
            continue
        if m.kind() == m.ValueKind_STRING:
            return m.as_string()
        return m.as_double() * _unit_scale(m.unit() or "")
    return math.nan


def _ranges(action) -> list[str]:
    """The push/pop NVTX ranges open at the launch, outermost first, over all domains."""
    state = action.nvtx_state()
    if state is None:
        return []
    out = []
    for d in state.domains():
        out += list(state.domain_by_id(d).push_pop_ranges())
    return out


def tensor_rate_metrics(names) -> list[str]:
    """The per-type tensor FLOP rate metrics to sum (see FLOP COUNTING): floating-point types, each once."""
    found = [(n, m) for n in names if (m := TENSOR_RATE.match(n))]
    whole = {m["type"] for _, m in found if not m["split"]}
    return sorted(n for n, m in found
                  if not m["type"].startswith(INTEGER_TYPES) and not (m["split"] and m["type"] in whole))


def stall_ratios(action, names) -> dict[str, float]:
    """reason -> warps stalled for it per issued instruction, for every reason the report holds."""
    found = {m["reason"]: _value(action, (n,)) for n in names if (m := STALL_RATIO.match(n))}
    return {reason: v for reason, v in found.items() if not math.isnan(v)}


def top_stalls(ratios: dict[str, float], count: int = TOP_STALLS) -> str:
    """The largest waits, 'reason ratio' comma-separated ('' without warp-state metrics)."""
    waits = sorted(((v, r) for r, v in ratios.items() if r != ISSUE_REASON), reverse=True)[:count]
    return ", ".join(f"{r} {v:.2f}" for v, r in waits)


def _launch(action, report: str) -> dict[str, Any]:
    v = {col: _value(action, names) for col, names in METRICS.items()}
    names = set(action.metric_names())
    ranges = _ranges(action)
    tag = next((t for t in map(parse_range_name, ranges) if t), None)
    if tag is None:  # not made by dsactl: the innermost range names the class
        tag = {"solution": "", "workload": "", "label": ranges[-1] if ranges else "-"}
    duration, cycles = v["duration_s"], v["sm_cycles_per_s"] * v["duration_s"]
    sass_flop = sum(_value(action, (n,)) * w for n, w in SASS_FLOPS.items() if n in names) * cycles
    tensor_flop = sum(_value(action, (n,)) for n in tensor_rate_metrics(names)) * cycles
    flop = tensor_flop + sass_flop
    dram_bytes = v["dram_bytes_per_s"] * duration
    sms = v["sms"]
    stalls = stall_ratios(action, names)
    conflicts = [_value(action, (n,)) for n in SMEM_CONFLICTS if n in names]
    return {
        "solution": tag["solution"], "workload": tag["workload"], "class": tag["label"], "kernel": action.name(),
        "duration_us": duration * 1e6, "grid": v["grid"], "block": v["block"], "registers": v["registers"],
        "smem_kib": v["smem"] / 1024, "sms": sms, "active_sms": min(v["grid"], sms), "waves": v["waves"],
        **{c: v[c] for c in ("sm_pct", "l1_pct", "l2_pct", "dram_pct", "tensor_pct", "occupancy_pct",
                             "theoretical_occupancy_pct")},
        "tensor_flop": tensor_flop, "sass_flop": sass_flop, "flop": flop, "tflops": flop / duration / 1e12,
        "dram_bytes": dram_bytes, "dram_gbs": dram_bytes / duration / 1e9,
        "intensity": flop / dram_bytes if dram_bytes > 0 else math.nan,
        "issue_pct": v["issue_per_cycle"] * 100, "cycles_per_issue": v["cycles_per_issue"],
        "stalls": top_stalls(stalls), "instructions": v["instructions"],
        "smem_conflicts": sum(conflicts) if conflicts else math.nan, "report": report,
        "_stalls": stalls,
        # the GPU and its roofs at the clocks this launch ran at, for plot.roofs()
        "_device": v["device"],
        "_dram_peak_bps": v["dram_peak_per_cycle"] * v["dram_cycles_per_s"],
        "_fp32_peak_flops": 2 * v["ffma_peak_per_cycle"] * v["sm_cycles_per_s"],
        "_bf16_peak_flops": v["bf16_peak_per_cycle"] * v["sm_cycles_per_s"],
        "_fp8_peak_flops": v["fp8_peak_per_cycle"] * v["sm_cycles_per_s"],
    }


def load(paths: list[str | Path]):
    """One row per profiled kernel launch, over all reports, in launch order."""
    import pandas as pd

    rows = []
    for path in map(Path, paths):
        ctx = open_report(path)
        for r in range(ctx.num_ranges()):
            rng = ctx.range_by_idx(r)
            rows += [_launch(rng.action_by_idx(a), path.name) for a in range(rng.num_actions())]
    if not rows:
        raise DsactlError(f"no kernel launch in {', '.join(map(str, paths))}")
    df = pd.DataFrame(rows)
    for col in ("grid", "block", "registers", "sms", "active_sms"):
        df[col] = df[col].astype("Int64")
    return df


PCT_COLUMNS = ("sm_pct", "l1_pct", "l2_pct", "dram_pct", "tensor_pct", "occupancy_pct", "theoretical_occupancy_pct")
CLASS_COLUMNS = ("solution", "kernel", "class", "launches", "duration_us", "registers", "active_sms", "sms",
                 *PCT_COLUMNS, "tflops", "dram_gbs", "intensity", "flop", "dram_bytes", "issue_pct", "cycles_per_issue",
                 "stalls", "instructions", "smem_conflicts")


def _time_weighted(values, durations) -> float:
    known = values.notna()
    return float((values[known] * durations[known]).sum() / durations[known].sum()) if known.any() else math.nan


def _class_stalls(g) -> dict[str, float]:
    """Each stall reason's ratio over a class's launches, weighed by time as utilisation is."""
    if "_stalls" not in g:
        return {}
    t = g["duration_us"]
    reasons = {r for ratios in g["_stalls"] for r in ratios}
    return {r: _time_weighted(g["_stalls"].map(lambda ratios, r=r: ratios.get(r, math.nan)), t) for r in reasons}


def by_class(kernels):
    """Per (solution, kernel, class): mean duration, active SMs and instructions, time-weighted utilisation
    and warp state, and rates and intensity from summed work over summed time (so long launches weigh as
    much as they cost). The stall reasons come from the launches' table (load()); a table read back from
    kernels.csv keeps only each launch's top reasons, so there a class shows none."""
    import pandas as pd

    rows = []
    for (solution, kernel, label), g in kernels.groupby(["solution", "kernel", "class"], sort=False):
        t = g["duration_us"]
        seconds = t.sum() * 1e-6
        flop, dram = g["flop"].sum(), g["dram_bytes"].sum()
        stalls = _class_stalls(g)
        rows.append({
            "solution": solution, "kernel": kernel, "class": label, "launches": len(g),
            "duration_us": t.mean(), "registers": g["registers"].max(), "active_sms": g["active_sms"].mean(),
            "sms": g["sms"].max(),
            **{c: _time_weighted(g[c], t) for c in PCT_COLUMNS},
            "tflops": flop / seconds / 1e12, "dram_gbs": dram / seconds / 1e9,
            "intensity": flop / dram if dram > 0 else math.nan, "flop": flop, "dram_bytes": dram,
            "issue_pct": _time_weighted(g["issue_pct"], t), "cycles_per_issue": _time_weighted(g["cycles_per_issue"], t),
            "stalls": top_stalls(stalls), "instructions": g["instructions"].mean(),
            "smem_conflicts": g["smem_conflicts"].mean(),
        })
    return pd.DataFrame(rows, columns=CLASS_COLUMNS)


# How tables show numbers (CSV keeps full precision).
_FORMATS = {"duration_us": "{:.2f}", "smem_kib": "{:.1f}", "waves": "{:.2f}", "active_sms": "{:.0f}",
            "tflops": "{:.2f}", "dram_gbs": "{:.0f}", "intensity": "{:.2f}", "flop": "{:.3g}", "tensor_flop": "{:.3g}",
            "sass_flop": "{:.3g}", "dram_bytes": "{:.3g}", "issue_pct": "{:.1f}", "cycles_per_issue": "{:.2f}",
            "instructions": "{:.3g}", "smem_conflicts": "{:.3g}", **{c: "{:.1f}" for c in PCT_COLUMNS}}


def formatted(df) -> list[list[str]]:
    """Rows of display strings: fixed decimals per column, '-' for missing values."""
    import pandas as pd

    def cell(col, v):
        if pd.isna(v) or v == "":
            return "-"
        fmt = _FORMATS.get(col)
        return fmt.format(v) if fmt and isinstance(v, (int, float)) else str(v)

    return [[cell(c, v) for c, v in zip(df.columns, row)] for row in df.itertuples(index=False)]


def to_markdown(df) -> str:
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(s.replace("|", "\\|") for s in row) + " |" for row in formatted(df)]
    return "\n".join(lines) + "\n"


def device_name(path: str | Path) -> str:
    """The GPU a report was taken on (its first launch's device name)."""
    ctx = open_report(path)
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        if rng.num_actions():
            name = _value(rng.action_by_idx(0), METRICS["device"])
            return name if isinstance(name, str) else "unknown GPU"
    return "unknown GPU"
