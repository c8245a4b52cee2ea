"""The embedded workload suites: contest (the default), scale, prefill, dispatch, edge, hostile.

All are deterministic: the same suite always lists the same workloads (seeded
by SUITE_SEED); inputs are drawn per call from make_inputs' seed.
"""

from __future__ import annotations

import random

from dsactl.definitions import CONTEST_ATTENTION, CONTEST_INDEXER
from dsactl.definitions.attention import CONTEST_SM_SCALE
from dsactl.errors import DsactlError
from dsactl.fp8 import PAGE_SIZE
from dsactl.workloads.workload import Workload

SUITE_SEED = 2026
SUITES = ("contest", "scale", "prefill", "dispatch", "edge", "hostile")
ALL = ("contest", "scale", "edge")  # `all`: hostile inputs are for verify, not timing; prefill is for GPUs (its size)
# Suites small enough that verify runs them whole under the Triton interpreter (no --quick subset on CPU).
INTERPRETER_SIZED = ("hostile",)

# Contest distributions (docs/design.md, Contracts).
CONTEST_INDEXER_WORKLOADS = 128
CONTEST_INDEXER_PASSTHROUGH = 69  # max_num_pages * 64 <= 2048: top-k keeps every valid token
CONTEST_INDEXER_NUM_PAGES = 11923
CONTEST_INDEXER_MAX_PAGES = 91  # 5824 tokens
CONTEST_INDEXER_BATCH = (1, 31)
CONTEST_ATTENTION_TOKENS = (1, 2, 6, 7, 8)
CONTEST_ATTENTION_WORKLOADS = 23
CONTEST_ATTENTION_NUM_PAGES = 8462
TOPK = 2048


def _indexer(uuid, suite, label, definition, seq_lens, max_num_pages, num_pages, **params) -> Workload:
    return Workload(uuid, definition, suite, label,
                    {"batch_size": len(seq_lens), "num_pages": num_pages, "max_num_pages": max_num_pages},
                    {"seq_lens": tuple(seq_lens), **params})


def _attention(uuid, suite, label, definition, num_tokens, num_pages, **params) -> Workload:
    return Workload(uuid, definition, suite, label, {"num_tokens": num_tokens, "num_pages": num_pages}, params)


def _topk(uuid, suite, label, definition, lengths, max_len=None, **params) -> Workload:
    max_len = max_len or max(lengths)
    return Workload(uuid, definition, suite, label, {"num_rows": len(lengths), "max_len": max_len},
                    {"lengths": tuple(lengths), **params})


def _prefill_indexer(uuid, suite, label, definition, prompts, queries=None, **params) -> Workload:
    """Causal prompts packed one after another; the last queries[i] tokens of prompt i query (all: None)."""
    num_tokens = sum(queries) if queries else sum(prompts)
    return Workload(uuid, definition, suite, label, {"num_tokens": num_tokens, "num_keys": sum(prompts)},
                    {"prompts": tuple(prompts), **({"queries": tuple(queries)} if queries else {}), **params})


def _pages(tokens: int) -> int:
    return (tokens + PAGE_SIZE - 1) // PAGE_SIZE


def contest() -> list[Workload]:
    rng = random.Random(SUITE_SEED)
    out = []
    short_pages = _pages(TOPK)
    for i in range(CONTEST_INDEXER_WORKLOADS):
        passthrough = i < CONTEST_INDEXER_PASSTHROUGH
        max_pages = rng.randint(1, short_pages) if passthrough else rng.randint(short_pages + 1, CONTEST_INDEXER_MAX_PAGES)
        batch = rng.randint(*CONTEST_INDEXER_BATCH)
        # The longest row fills its last page partly or fully, so max_num_pages is tight.
        longest = rng.randint((max_pages - 1) * PAGE_SIZE + 1, max_pages * PAGE_SIZE)
        seq_lens = [longest] + [rng.randint(1, longest) for _ in range(batch - 1)]
        rng.shuffle(seq_lens)
        out.append(_indexer(f"contest-indexer-{i:03d}", "contest", "passthrough" if passthrough else "scored",
                            CONTEST_INDEXER, seq_lens, max_pages, CONTEST_INDEXER_NUM_PAGES))
    for i in range(CONTEST_ATTENTION_WORKLOADS):
        t = CONTEST_ATTENTION_TOKENS[i % len(CONTEST_ATTENTION_TOKENS)]
        full = i % 3 == 0
        valid = [TOPK] * t if full else [rng.randint(1, TOPK) for _ in range(t)]
        out.append(_attention(f"contest-attention-{i:03d}", "contest", "full" if full else "padded",
                              CONTEST_ATTENTION, t, CONTEST_ATTENTION_NUM_PAGES, pattern="tail", valid=tuple(valid)))
    return out


SCALE_INDEXER_BATCH = (1, 8, 32, 64, 128)
SCALE_INDEXER_CONTEXT = (4096, 32768, 131072)
SCALE_ATTENTION_HEADS = (16, 32, 64, 128)  # TP8, TP4, TP2 and one GPU of DeepSeek-V3.2's 128 heads
SCALE_ATTENTION_TOKENS = (1, 8, 32, 128, 256, 512)
SCALE_ATTENTION_NUM_PAGES = 8192
SCALE_TOPK_ROWS = (1, 8, 32, 64, 128)
SCALE_TOPK_LENGTHS = (2049, 5824, 8192, 32768, 131072)


def _attention_grid(suite_name: str, heads: tuple[int, ...], tokens: tuple[int, ...], num_pages: int) -> list[Workload]:
    """Full rows of topk 2048 at every heads x tokens, bf16 and FP8 KV (FP8 with power-of-two scales, as the
    model writes its cache)."""
    out = []
    for h in heads:
        for t in tokens:
            for fp8 in (False, True):
                name = f"dsa_sparse_attention_h{h}_ckv512_kpe64_topk2048_ps64" + ("_fp8kv" if fp8 else "")
                out.append(_attention(f"{suite_name}-attention-h{h}-t{t}-{'fp8' if fp8 else 'bf16'}", suite_name,
                                      f"h{h}", name, t, num_pages, pattern="full",
                                      **({"kv_scales": "ue8m0"} if fp8 else {})))
    return out


def scale() -> list[Workload]:
    out = []
    for b in SCALE_INDEXER_BATCH:
        for ctx in SCALE_INDEXER_CONTEXT:
            out.append(_indexer(f"scale-indexer-b{b}-ctx{ctx}", "scale", f"ctx{ctx // 1024}k", CONTEST_INDEXER,
                                [ctx] * b, _pages(ctx), b * _pages(ctx) + 64))
    out += _attention_grid("scale", SCALE_ATTENTION_HEADS, SCALE_ATTENTION_TOKENS, SCALE_ATTENTION_NUM_PAGES)
    for bf16 in (False, True):
        for rows in SCALE_TOPK_ROWS:
            for length in SCALE_TOPK_LENGTHS:
                name = "dsa_topk_page_transform_topk2048_ps64" + ("_bf16" if bf16 else "")
                out.append(_topk(f"scale-topk-r{rows}-len{length}-{'bf16' if bf16 else 'fp32'}", "scale",
                                 f"len{length}", name, [length] * rows))
    return out


PREFILL_HEADS = (64, 128)  # the head counts FlashMLA's sparse prefill kernel takes, beside which it is timed
PREFILL_TOKENS = (1024, 2048, 4096, 8192)  # query tokens of a prefill chunk
PREFILL_NUM_PAGES = 1024  # a 64K-token context: each cached token is gathered 32 to 256 times


PREFILL_INDEXER = "dsa_prefill_indexer_fp8_h64_d128_topk2048"
# One causal prompt, every token a query; at 64K tokens its fp32 logits would take 16 GiB, which is what the
# fused top-k and the chunked path avoid.
PREFILL_INDEXER_PROMPTS = (4096, 16384, 65536)


def prefill() -> list[Workload]:
    """Sparse attention at prefill sizes: thousands of query tokens over one long context; the prefill indexer
    over whole causal prompts."""
    return (_attention_grid("prefill", PREFILL_HEADS, PREFILL_TOKENS, PREFILL_NUM_PAGES)
            + [_prefill_indexer(f"prefill-indexer-s{s}", "prefill", f"s{s // 1024}k", PREFILL_INDEXER, (s,))
               for s in PREFILL_INDEXER_PROMPTS])


# Every power of two up to the scale suite's 128: the attention dispatch's token thresholds lie among them.
DISPATCH_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)


def dispatch() -> list[Workload]:
    """Sparse attention at every head count and the small token counts where the dispatch chooses between
    kernels; timed with each kernel forced (bench's dsactl-<kernel> plug-ins), it is the measurement the
    dispatch's thresholds come from (kernels/attention/dispatch.py)."""
    return _attention_grid("dispatch", SCALE_ATTENTION_HEADS, DISPATCH_TOKENS, SCALE_ATTENTION_NUM_PAGES)


EDGE_LENGTHS = (1, 63, 64, 65, 2047, 2048, 2049, 5824, 6145)
LARGE_Q = 2.0**17  # q of N(0, 1) times this passes 65504 in nearly every head
TOPK_PATTERNS = ("all_equal", "two_values", "one_bin", "ascending", "descending", "neg_inf_tail", "nan")


def edge() -> list[Workload]:
    out = []
    for n in EDGE_LENGTHS:
        out.append(_indexer(f"edge-indexer-len{n}", "edge", "length", CONTEST_INDEXER, [n, max(1, n // 2), n],
                            _pages(n), 3 * _pages(n) + 8, table_pad=-1))
    out.append(_indexer("edge-indexer-ties", "edge", "ties", CONTEST_INDEXER, [5824, 3000], _pages(5824), 200,
                        pattern="ties"))
    for n in (2, 4):
        out.append(_indexer(f"edge-indexer-nextn{n}", "edge", "mtp",
                            f"dsa_topk_indexer_fp8_h64_d128_topk2048_ps64_nextn{n}", [n, 2049, 2050, 6145],
                            _pages(6145), 256))
    for heads in (16, 128):
        for fp8 in (False, True):
            base = f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk2048_ps64" + ("_fp8kv" if fp8 else "")
            tag = f"h{heads}-{'fp8' if fp8 else 'bf16'}"
            out.append(_attention(f"edge-attention-empty-{tag}", "edge", "empty", base, 3, 512, pattern="empty"))
            out.append(_attention(f"edge-attention-scattered-{tag}", "edge", "scattered", base, 4, 512,
                                  pattern="scattered", valid=(1, 100, 1500, 2047)))
            out.append(_attention(f"edge-attention-duplicates-{tag}", "edge", "duplicates", base, 2, 512,
                                  pattern="duplicates"))
            # q past fp16's 65504 (the Hopper FP8 path multiplies in fp16), the logits as usual.
            out.append(_attention(f"edge-attention-large-q-{tag}", "edge", "magnitude", base, 3, 512,
                                  pattern="scattered", valid=(2048, 7, 300), q_scale=LARGE_Q,
                                  sm_scale=CONTEST_SM_SCALE / LARGE_Q))
            if fp8:  # tokens with power-of-two and with other scales side by side (the fast and the general dequant)
                out.append(_attention(f"edge-attention-mixed-scales-{tag}", "edge", "scales", base, 3, 512,
                                      pattern="scattered", valid=(2048, 1000, 64), kv_scales="mixed"))
    # FlashMLA's layouts: pages of other sizes, each padded by a row as its tests allocate them (ids page * N +
    # offset; the padding poisoned), and rows up to its largest topk.
    for heads, topk, page_size, suffix, tokens, pages, padded in (
            (64, 128, 2, "_fp8kv", 3, 100, True), (128, 576, 61, "_fp8kv_lsee_sink", 2, 12, True),
            (64, 512, 576, "_lsee_topklen", 3, 2, True), (128, 16384, 64, "_fp8kv_lsee", 2, 300, False)):
        out.append(_attention(f"edge-attention-ps{page_size}-topk{topk}-h{heads}", "edge", "pages",
                              f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{topk}_ps{page_size}{suffix}", tokens,
                              pages, pattern="scattered", valid=(topk, topk // 3, 0)[:tokens], padded_pages=padded))
    for suffix in ("_lsee", "_topklen", "_sink", "_fp8kv_lsee_topklen_sink"):
        out.append(_attention(f"edge-attention-variant{suffix}", "edge", "variant",
                              f"dsa_sparse_attention_h64_ckv512_kpe64_topk2048_ps64{suffix}", 3, 512,
                              pattern="scattered", valid=(0, 700, 2048)))
    for pattern in TOPK_PATTERNS:
        for bf16 in (False, True):
            name = "dsa_topk_page_transform_topk2048_ps64" + ("_bf16" if bf16 else "")
            out.append(_topk(f"edge-topk-{pattern}-{'bf16' if bf16 else 'fp32'}", "edge", pattern, name,
                             [20000, 2049, 6145], pattern=pattern))
    for n in EDGE_LENGTHS + (65536,):
        out.append(_topk(f"edge-topk-len{n}", "edge", "length", "dsa_topk_page_transform_topk2048_ps64",
                         [n, 1, max(1, n - 1)], max_len=n + 5))
    out.append(_topk("edge-topk-mtp", "edge", "mtp", "dsa_topk_page_transform_topk2048_ps64",
                     [3000, 3001, 3002, 7000], rows_per_request=2))
    # The prefill indexer: rows shorter and longer than topk across two prompts, the first query of a prompt
    # (one key), and ties.
    small = "dsa_prefill_indexer_fp8_h32_d64_topk512"
    out.append(_prefill_indexer("edge-prefill-indexer-prompts", "edge", "prefill", small, (700, 900), (40, 24)))
    out.append(_prefill_indexer("edge-prefill-indexer-whole", "edge", "prefill", small, (600,)))
    out.append(_prefill_indexer("edge-prefill-indexer-ties", "edge", "ties", small, (800,), (16,), pattern="ties"))
    return out


HOSTILE_ATTENTION = (("h16-bf16", CONTEST_ATTENTION), ("h16-fp8", CONTEST_ATTENTION + "_fp8kv"),
                     ("h64-fp8", "dsa_sparse_attention_h64_ckv512_kpe64_topk2048_ps64_fp8kv"),
                     ("h128-bf16", "dsa_sparse_attention_h128_ckv512_kpe64_topk2048_ps64"))
HOSTILE_NUM_PAGES = 40  # 2560 tokens: room for a row of 2048 distinct ids, small enough to interpret


def hostile() -> list[Workload]:
    """Values outside the contracts (dsactl/workloads/hostile.py says which and what is due), then one
    clean workload per stage, which must pass in the same process after them."""
    out = []
    for label, table in (("scored", 80), ("passthrough", 32)):
        out.append(_indexer(f"hostile-indexer-bad-pages-{label}", "hostile", "bad_pages", CONTEST_INDEXER,
                            [min(5000, table * PAGE_SIZE), 700, 1], table, 2 * table + 8, table_pad=-1,
                            hostile="bad_pages"))
    out.append(_indexer("hostile-indexer-bad-pages-nextn2", "hostile", "bad_pages",
                        "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64_nextn2", [3000, 2], 47, 100, hostile="bad_pages"))
    # Generated with full tables of distinct pages, then seq_lens past them, negative or zero.
    out.append(_indexer("hostile-indexer-seq-lens-scored", "hostile", "seq_lens", CONTEST_INDEXER, [2560] * 4, 40, 200,
                        hostile="seq_lens", values=(5000, -5, 0, 2600)))
    out.append(_indexer("hostile-indexer-seq-lens-passthrough", "hostile", "seq_lens", CONTEST_INDEXER, [1280, 1280],
                        20, 48, hostile="seq_lens", values=(3000, -1)))
    out.append(_indexer("hostile-indexer-nan", "hostile", "nan", CONTEST_INDEXER, [3000, 100], 47, 100, hostile="nan"))
    out.append(Workload("hostile-indexer-empty", CONTEST_INDEXER, "hostile", "empty",
                        {"batch_size": 0, "num_pages": 4, "max_num_pages": 3}, {"seq_lens": (), "hostile": "empty"}))
    for tag, name in HOSTILE_ATTENTION:
        for kind in ("bad_ids", "nan"):
            out.append(_attention(f"hostile-attention-{kind.replace('_', '-')}-{tag}", "hostile", kind, name, 3,
                                  HOSTILE_NUM_PAGES, pattern="scattered", valid=(2048, 1000, 7), hostile=kind))
        out.append(Workload(f"hostile-attention-empty-{tag}", name, "hostile", "empty",
                            {"num_tokens": 0, "num_pages": 2}, {"hostile": "empty"}))
    out.append(_attention("hostile-attention-topk-length", "hostile", "topk_length",
                          "dsa_sparse_attention_h64_ckv512_kpe64_topk2048_ps64_topklen", 3, HOSTILE_NUM_PAGES,
                          hostile="topk_length", values=(-5, 5000, 100)))
    for bf16 in (False, True):
        name = "dsa_topk_page_transform_topk2048_ps64" + ("_bf16" if bf16 else "")
        tag = "bf16" if bf16 else "fp32"
        out.append(_topk(f"hostile-topk-bad-pages-{tag}", "hostile", "bad_pages", name, [20000, 3000, 100],
                         hostile="bad_pages"))
        out.append(_topk(f"hostile-topk-bad-batch-{tag}", "hostile", "bad_batch", name, [5000, 5000, 3000, 100],
                         hostile="bad_batch"))
        out.append(_topk(f"hostile-topk-lengths-{tag}", "hostile", "lengths", name, [3000] * 4,
                         hostile="lengths", values=(-5, 5000, 0, 2999)))
        out.append(_topk(f"hostile-topk-nan-{tag}", "hostile", "nan", name, [20000, 3000], hostile="nan"))
        out.append(Workload(f"hostile-topk-empty-{tag}", name, "hostile", "empty",
                            {"num_rows": 0, "max_len": 64, "batch_size": 0, "max_num_pages": 1},
                            {"lengths": (), "hostile": "empty"}))
    out.append(_indexer("hostile-after-indexer", "hostile", "clean", CONTEST_INDEXER, [3000, 100], 47, 100))
    for tag, name in HOSTILE_ATTENTION:
        out.append(_attention(f"hostile-after-attention-{tag}", "hostile", "clean", name, 3, HOSTILE_NUM_PAGES,
                              pattern="scattered", valid=(2048, 1000, 7)))
    out.append(_topk("hostile-after-topk", "hostile", "clean", "dsa_topk_page_transform_topk2048_ps64",
                     [20000, 3000, 100]))
    return out


def suite(name: str) -> list[Workload]:
    makers = {"contest": contest, "scale": scale, "prefill": prefill, "dispatch": dispatch, "edge": edge,
              "hostile": hostile}
    if name == "all":
        return [w for suite_name in ALL for w in makers[suite_name]()]
    if name not in makers:
        raise DsactlError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)} or all ({', '.join(ALL)})")
    return makers[name]()
