"""Where the contest time of the sparse MLA Triton launcher goes, and which launch settings cut it.

    python3 profiles/h200/attention/triton_variants.py OUTDIR [breakdown] [combine] [configs] [onetile]
        [production] [stages] [production_splits] [combine_hopper]

One process, bench's own timing (CUPTI kernel time summed over a call's launches, cold L2 before
every call, median of ITERS), the checkout's launcher with its module settings swapped per
variant (and restored):
1. breakdown.csv: every contest attention workload, the whole call and the split kernel alone
   (the combine launch skipped), so combine = whole - split;
2. combine.csv: the contest suite with other combine tiles (COMBINE_BLOCK_D, COMBINE_WARPS);
3. configs.csv: 16 heads bf16, full rows, T in (1, 2, 8): tile configurations x split counts;
4. onetile.csv: the same at T in (6, 8), the 64-token tile against one 128-token tile a program;
   kernels.csv: the registers of every configuration compiled. (prefetch.csv is this part as run at
   commit 5300926, whose bf16 kernel could also load the next tile's rows by hand: prefetch=True.)
5. production.csv: 64 and 128 heads, bf16 and FP8 KV, full rows, T in PRODUCTION_TOKENS: the shipped
   configuration against PRODUCTION_CONFIGS (pipeline depth, FP8 tile), each with its own split count;
6. stages.csv: the contest suite with the 16-head tiles one pipeline stage deeper (CONTEST_STAGES);
7. production_splits.csv: the shipped configuration at 64 and 128 heads at every split count in
   PRODUCTION_SPLITS, for the token counts where the formula splits (PRODUCTION_SPLIT_TOKENS);
8. combine_hopper.csv: the Hopper kernel's calls (64 and 128 heads, bf16 and FP8, T in
   COMBINE_HOPPER_TOKENS, its own split formula): the kernel alone (combine skipped) and the whole call
   with each combine tile of COMBINES_HOPPER (its partials, 8-32 splits of 64 heads, are larger than
   the contest's the shipped tile was tuned on).
Every variant's output is compared with the shipped settings' output on the same inputs
(max |difference|), so a variant that computes something else shows up.
"""

from __future__ import annotations

import contextlib
import csv
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_old_vs_new as bo  # noqa: E402  (its workload and timing helpers)

from dsactl.bench.timing import L2Flusher, pick_method  # noqa: E402
from dsactl.kernels.attention import hopper_mla  # noqa: E402
from dsactl.kernels.attention import triton_sparse_mla as mla  # noqa: E402
from dsactl.workloads import suite  # noqa: E402

base_config = mla.config

# (COMBINE_BLOCK_D, COMBINE_WARPS, COMBINE_TILE): the shipped one first
COMBINES = [(mla.COMBINE_BLOCK_D, mla.COMBINE_WARPS, mla.COMBINE_TILE), (128, 4, 8192), (64, 4, 4096),
            (32, 4, 4096), (32, 4, 2048)]
# (COMBINE_BLOCK_D, COMBINE_WARPS, COMBINE_TILE), the shipped one first; tiles up to the shipped
# COMBINE_TILE, which the kernel's static_assert reads as a constexpr (patching it is refused). Warps lie
# along heads: 8 warps with fewer than 8 heads a program (64 columns at 16+ splits, 128 at 8+) put
# splits across warps.
COMBINES_HOPPER = [(64, 4, 8192), (32, 4, 4096), (32, 8, 8192), (64, 8, 8192), (128, 8, 8192)]
COMBINE_HOPPER_TOKENS = (1, 2, 4, 8, 16)
CONFIG_TOKENS = (1, 2, 8)
CONFIGS = [mla.Config(16, n, w, s) for n in (64, 32) for w in (8, 4) for s in (2, 1)]
SPLITS = (8, 16, 32, 64)
ONE_TILE_TOKENS = (6, 8)
ONE_TILE_CONFIGS = [mla.config(16, False), mla.Config(16, 128, 8, 1)]
ONE_TILE_SPLITS = (8, 16, 32)
# Contest variants: (name, 64-token config stages, small-grid config stages); the shipped one first.
CONTEST_STAGES = [("shipped", 2, 2), ("n64_3", 3, 2), ("small_3", 2, 3), ("both_3", 3, 3)]
PRODUCTION_TOKENS = (1, 8, 32, 128)
PRODUCTION_SPLIT_TOKENS = (2, 4, 8, 16, 32, 64)
PRODUCTION_SPLITS = (1, 2, 4, 8, 16, 32)
# (block_n, warps, stages) tried at 64 and 128 heads. With its strides known to be multiples of 16
# (as the JIT specializes them) Triton 3.6 turns the bf16 row gather into cp.async only at 3 stages.
PRODUCTION_CONFIGS = {False: [(64, 8, 3), (64, 8, 4)], True: [(32, 8, 3), (32, 8, 4), (64, 8, 3)]}


@contextlib.contextmanager
def settings(**overrides):
    """The launcher module with some of its globals replaced for the duration."""
    saved = {k: getattr(mla, k) for k in overrides}
    for k, v in overrides.items():
        setattr(mla, k, v)
    mla.combine_config.cache_clear()
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(mla, k, v)
        mla.combine_config.cache_clear()


def run(call, outputs):
    outputs["output"].fill_(float("nan"))  # poisoned: an unwritten element shows as a difference
    call()
    torch.cuda.synchronize()
    return outputs["output"].float().clone()


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().nan_to_num(float("inf")).max())


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def production_cases(token_counts):
    """(heads, fp8, tokens, inputs, outputs) at 64 and 128 heads, bf16 and FP8 KV, each token count."""
    for heads, fp8, tokens in [(h, f, t) for h in (64, 128) for f in (False, True) for t in token_counts]:
        yield heads, fp8, tokens, *bo.prepared(bo.production_workload(heads, tokens, fp8))


def main(out: str, parts: list[str]) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    method, flusher = pick_method(), L2Flusher()
    print(f"{torch.cuda.get_device_name()} timing {method}, {bo.ITERS} iters, cold L2", flush=True)
    contest = [w for w in suite("contest") if w.definition.startswith("dsa_sparse_attention")]
    prepared = [(w, *bo.prepared(w)) for w in contest]

    rows = []
    for w, inputs, outputs in prepared if "breakdown" in parts else []:
        call = bo.launcher_call(mla, inputs, outputs, False)
        whole = bo.time_us(call, method, flusher)
        with settings(combine=lambda *a, **k: None):
            split = bo.time_us(call, method, flusher)
        rows.append({"workload": w.uuid, "tokens": inputs["q_nope"].shape[0],
                     "valid": int((inputs["sparse_indices"] >= 0).sum()), "whole_us": round(whole, 2),
                     "split_us": round(split, 2), "combine_us": round(whole - split, 2)})
        print(rows[-1], flush=True)
    if rows:
        write_csv(out_dir / "breakdown.csv", rows)

    combine_rows = []
    for w, inputs, outputs in prepared if "combine" in parts else []:
        call = bo.launcher_call(mla, inputs, outputs, False)
        ref = run(call, outputs)
        for block_d, warps, tile in COMBINES:
            with settings(COMBINE_BLOCK_D=block_d, COMBINE_WARPS=warps, COMBINE_TILE=tile):
                got = run(call, outputs)
                us = bo.time_us(call, method, flusher)
            combine_rows.append({"workload": w.uuid, "block_d": block_d, "warps": warps, "tile": tile,
                                 "us": round(us, 2),
                                 "max_diff": diff(got, ref)})
    if combine_rows:
        write_csv(out_dir / "combine.csv", combine_rows)
    print("\ncombine (BLOCK_D, warps, tile): contest mean / max us, max diff")
    for block_d, warps, tile in COMBINES if combine_rows else ():
        r = [x for x in combine_rows if (x["block_d"], x["warps"], x["tile"]) == (block_d, warps, tile)]
        print(f"  ({block_d:3d}, {warps}, {tile:4d}) {statistics.mean(x['us'] for x in r):6.2f} "
              f"{max(x['us'] for x in r):6.2f}"
              f"  {max(x['max_diff'] for x in r):.3g}", flush=True)

    config_rows = []
    sweeps = [(CONFIG_TOKENS, CONFIGS, SPLITS)] if "configs" in parts else []
    sweeps += [(ONE_TILE_TOKENS, ONE_TILE_CONFIGS, ONE_TILE_SPLITS)] if "onetile" in parts else []
    for tokens, cfgs, split_counts in [(t, c, s) for ts, c, s in sweeps for t in ts]:
        inputs, outputs = bo.prepared(bo.production_workload(16, tokens, False))
        ref = run(bo.launcher_call(mla, inputs, outputs, False), outputs)
        for cfg in cfgs:
            for splits in split_counts:
                if splits * cfg.block_n > bo.TOPK:
                    continue
                call = bo.launcher_call(mla, inputs, outputs, False, splits)
                with settings(launch_config=lambda *args, cfg=cfg: cfg):
                    got = run(call, outputs)
                    us = bo.time_us(call, method, flusher)
                config_rows.append({"tokens": tokens, "block_n": cfg.block_n, "warps": cfg.num_warps,
                                    "stages": cfg.num_stages, "splits": splits,
                                    "us": round(us, 2),
                                    "max_diff": diff(got, ref)})
                print(config_rows[-1], flush=True)
    if config_rows:
        write_csv(out_dir / ("configs.csv" if "configs" in parts else "onetile.csv"), config_rows)
        write_csv(out_dir / "kernels.csv", bo.kernel_rows(mla, "variants"))

    stage_rows = []
    for w, inputs, outputs in prepared if "stages" in parts else []:
        call = bo.launcher_call(mla, inputs, outputs, False)
        ref = run(call, outputs)
        base, small = mla.config(16, False), mla._SMALL_GRID
        for name, n64, nsmall in CONTEST_STAGES:
            def config(heads, fp8kv, n64=n64):
                cfg = base_config(heads, fp8kv)
                return mla.Config(cfg.block_h, cfg.block_n, cfg.num_warps, n64) if cfg == base else cfg
            small_cfg = mla.Config(small.block_h, small.block_n, small.num_warps, nsmall)
            with settings(config=config, _SMALL_GRID=small_cfg):
                got = run(call, outputs)
                us = bo.time_us(call, method, flusher)
            stage_rows.append({"workload": w.uuid, "tokens": inputs["q_nope"].shape[0], "variant": name,
                               "us": round(us, 2), "max_diff": diff(got, ref)})
            print(stage_rows[-1], flush=True)
    if stage_rows:
        write_csv(out_dir / "stages.csv", stage_rows)
    for name, *_ in CONTEST_STAGES if stage_rows else ():
        r = [x for x in stage_rows if x["variant"] == name]
        print(f"contest {name:8s} mean {statistics.mean(x['us'] for x in r):.3f} max {max(x['us'] for x in r):.2f} "
              f"diff {max(x['max_diff'] for x in r):.3g}", flush=True)

    production_rows = []
    cases = production_cases(PRODUCTION_TOKENS) if "production" in parts else ()
    for heads, fp8, tokens, inputs, outputs in cases:
        call = bo.launcher_call(mla, inputs, outputs, fp8)
        ref = run(call, outputs)
        shipped = mla.config(heads, fp8)
        variants = [shipped] + [mla.Config(64, n, w, st) for n, w, st in PRODUCTION_CONFIGS[fp8]]
        for cfg in variants:
            with settings(launch_config=lambda *args, cfg=cfg: cfg):
                got = run(call, outputs)
                us = bo.time_us(call, method, flusher)
            flops = 2 * tokens * heads * bo.TOPK * (576 + 512)
            production_rows.append({"heads": heads, "kv": "fp8" if fp8 else "bf16", "tokens": tokens,
                                    "block_n": cfg.block_n, "warps": cfg.num_warps, "stages": cfg.num_stages,
                                    "shipped": cfg == shipped,
                                    "splits": mla.num_splits_for(tokens, heads, bo.TOPK, cfg, mla._num_sms(
                                        inputs["q_nope"].device)),
                                    "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
                                    "max_diff": diff(got, ref)})
            print(production_rows[-1], flush=True)
    if production_rows:
        write_csv(out_dir / "production.csv", production_rows)
        write_csv(out_dir / "kernels-production.csv", bo.kernel_rows(mla, "production"))

    split_rows = []
    cases = production_cases(PRODUCTION_SPLIT_TOKENS) if "production_splits" in parts else ()
    for heads, fp8, tokens, inputs, outputs in cases:
        formula = mla.num_splits_for(tokens, heads, bo.TOPK, mla.config(heads, fp8), mla._num_sms(
            inputs["q_nope"].device))
        for splits in PRODUCTION_SPLITS:
            us = bo.time_us(bo.launcher_call(mla, inputs, outputs, fp8, splits), method, flusher)
            split_rows.append({"heads": heads, "kv": "fp8" if fp8 else "bf16", "tokens": tokens, "splits": splits,
                               "formula": splits == formula, "us": round(us, 2)})
        print(f"h{heads} {'fp8' if fp8 else 'bf16'} T={tokens}: " + " ".join(
            f"{'*' if r['formula'] else ''}S{r['splits']}={r['us']}" for r in split_rows[-len(PRODUCTION_SPLITS):]),
            flush=True)
        del inputs, outputs
    if split_rows:
        write_csv(out_dir / "production_splits.csv", split_rows)

    hopper_rows = []
    cases = production_cases(COMBINE_HOPPER_TOKENS) if "combine_hopper" in parts else ()
    for heads, fp8, tokens, inputs, outputs in cases:
        call = bo.launcher_call(hopper_mla, inputs, outputs, fp8)
        ref = run(call, outputs)
        with settings(combine=lambda *a, **k: None):
            kernel_us = bo.time_us(call, method, flusher)
        row = {"heads": heads, "kv": "fp8" if fp8 else "bf16", "tokens": tokens,
               "splits": hopper_mla.num_splits_for(tokens, heads, bo.TOPK, mla._num_sms(inputs["q_nope"].device)),
               "kernel_us": round(kernel_us, 2)}
        for block_d, warps, tile in COMBINES_HOPPER:
            with settings(COMBINE_BLOCK_D=block_d, COMBINE_WARPS=warps, COMBINE_TILE=tile):
                got = run(call, outputs)
                row[f"d{block_d}w{warps}t{tile}"] = round(bo.time_us(call, method, flusher), 2)
                row[f"diff_d{block_d}w{warps}t{tile}"] = diff(got, ref)
        hopper_rows.append(row)
        print(row, flush=True)
        del inputs, outputs
    if hopper_rows:
        write_csv(out_dir / "combine_hopper.csv", hopper_rows)
        names = [f"d{d}w{w}t{t}" for d, w, t in COMBINES_HOPPER]
        print("\nHopper calls, us (kernel alone, then whole call per combine tile; the shipped tile first)")
        print(f"{'shape':16s} {'S':>3s} {'kernel':>7s} " + " ".join(f"{n:>13s}" for n in names))
        for r in hopper_rows:
            print(f"h{r['heads']} {r['kv']} T={r['tokens']:<3d} {r['splits']:3d} {r['kernel_us']:7.2f} "
                  + " ".join(f"{r[n]:13.2f}" for n in names))

    print("\nworkload                 T  valid  whole  split  combine")
    for r in rows:
        print(f"{r['workload']:22s} {r['tokens']:3d} {r['valid']:6d} {r['whole_us']:6.2f} {r['split_us']:6.2f} "
              f"{r['combine_us']:6.2f}")
    if rows:
        print(f"contest mean {statistics.mean(r['whole_us'] for r in rows):.2f} us")
    print("\nh16 bf16 best per T:")
    for tokens in sorted({r["tokens"] for r in config_rows}):
        best = sorted((r for r in config_rows if r["tokens"] == tokens), key=lambda r: r["us"])[:4]
        for r in best:
            print(f"  T={tokens} N={r['block_n']} warps={r['warps']} stages={r['stages']} "
                  f"S={r['splits']}: "
                  f"{r['us']} us (diff {r['max_diff']:.3g})")
    print("\nproduction: heads kv T, then us per (block_n, warps, stages); * = shipped")
    for heads, kv, tokens in dict.fromkeys((r["heads"], r["kv"], r["tokens"]) for r in production_rows):
        r = [x for x in production_rows if (x["heads"], x["kv"], x["tokens"]) == (heads, kv, tokens)]
        print(f"  h{heads} {kv} T={tokens:3d}: " + "  ".join(
            f"{'*' if x['shipped'] else ''}({x['block_n']},{x['warps']},{x['stages']}) {x['us']}" for x in r))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["breakdown", "combine", "configs", "onetile"])
