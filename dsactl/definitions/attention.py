"""dsa_sparse_attention: sparse MLA decode attention over selected tokens.

Contest contract (docs/design.md, Contracts): dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64.
Variants by name: heads {16, 32, 64, 128}; topk any multiple of 64 up to 16384
(FlashMLA's largest); `_ps<N>`: pages of N tokens (token id = page * N + offset;
64 in the contest); `_fp8kv` (one int8 [num_pages, N, 656] cache in the FP8 MLA
token layout instead of two bf16 caches); `_lsee` (natural-log LSE instead of base 2);
`_topklen` (per-row topk_length: only the first topk_length[t] indices count);
`_sink` (per-head attention sink: out *= 1 / (1 + exp(sink - lse_e)); the lse
output is the one without the sink).
"""

from __future__ import annotations

import math
import re

from dsactl.definitions.base import Definition, TensorSpec
from dsactl.fp8 import MLA_CKV_DIM, MLA_KPE_DIM, MLA_TOKEN_BYTES, PAGE_SIZE, dequantize_mla_kv

HEADS = (16, 32, 64, 128)
TOPK_STEP = 64  # topk is whole blocks of 64 ids (the CUDA kernels' gather block, FlashMLA's too)
MAX_TOPK = 16384
CONTEST_SM_SCALE = 0.1352337788608801
NAME_RE = re.compile(
    r"^dsa_sparse_attention_h(\d+)_ckv512_kpe64_topk(\d+)_ps(\d+)"
    r"(?P<fp8kv>_fp8kv)?(?P<lsee>_lsee)?(?P<topklen>_topklen)?(?P<sink>_sink)?$"
)
PAGE_RE = re.compile(r"^(dsa_sparse_attention_h\d+_ckv512_kpe64_topk\d+)_ps\d+")


def any_page_size(name: str) -> str:
    """The name with the contest's page size: what solutions match, since every attention kernel addresses
    tokens by id, whatever the pages they sit in."""
    return PAGE_RE.sub(rf"\1_ps{PAGE_SIZE}", name)


def reference(q_nope, q_pe, sparse_indices, sm_scale, ckv_cache=None, kpe_cache=None, kv_cache=None,
              topk_length=None, attn_sink=None, lse_base=2.0):
    """Per query token: gather the selected tokens (index -1 is padding), logits =
    (q_nope . ckv + q_pe . kpe) * sm_scale, softmax, out = P . ckv; lse in base
    `lse_base`. A token with no valid index gives out 0 and lse -inf. Bad values are
    masked, as the kernels mask them: an index outside [0, cache tokens) counts as -1,
    and topk_length is clamped to [0, topk]."""
    import torch

    num_tokens, num_heads, _ = q_nope.shape
    if kv_cache is not None:
        ckv_flat, kpe_flat = dequantize_mla_kv(kv_cache.reshape(-1, MLA_TOKEN_BYTES))
    else:
        ckv_flat = ckv_cache.reshape(-1, MLA_CKV_DIM).float()
        kpe_flat = kpe_cache.reshape(-1, MLA_KPE_DIM).float()
    output = torch.zeros(num_tokens, num_heads, MLA_CKV_DIM, dtype=torch.float32, device=q_nope.device)
    lse = torch.full((num_tokens, num_heads), -math.inf, dtype=torch.float32, device=q_nope.device)
    cache_tokens = ckv_flat.shape[0]
    for t in range(num_tokens):
        idx = sparse_indices[t]
        if topk_length is not None:
            idx = idx[: min(max(int(topk_length[t]), 0), idx.numel())]
        idx = idx[(idx >= 0) & (idx < cache_tokens)].long()
        if idx.numel() == 0:
            continue
        ckv, kpe = ckv_flat[idx], kpe_flat[idx]  # [n, 512], [n, 64]
        logits = (q_nope[t].float() @ ckv.T + q_pe[t].float() @ kpe.T) * float(sm_scale)  # [H, n]
        lse_e = torch.logsumexp(logits, dim=-1)  # [H]
        out = torch.softmax(logits, dim=-1) @ ckv  # [H, 512]
        if attn_sink is not None:
            out = out / (1.0 + torch.exp(attn_sink.float() - lse_e))[:, None]
        output[t] = out
        lse[t] = lse_e / math.log(lse_base)
    return output.to(torch.bfloat16), lse


def make(heads: int = 16, topk: int = 2048, fp8kv: bool = False, lse_base_e: bool = False,
         topk_length: bool = False, sink: bool = False, page_size: int = PAGE_SIZE) -> Definition:
    if heads not in HEADS:
        raise ValueError(f"attention heads must be one of {HEADS}, got {heads}")
    if topk % TOPK_STEP or not 0 < topk <= MAX_TOPK:
        raise ValueError(f"attention topk must be a multiple of {TOPK_STEP} in [{TOPK_STEP}, {MAX_TOPK}], got {topk}")
    if page_size < 1:
        raise ValueError(f"attention pages hold at least one token, got {page_size}")
    name = (f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{topk}_ps{page_size}"
            + ("_fp8kv" if fp8kv else "") + ("_lsee" if lse_base_e else "")
            + ("_topklen" if topk_length else "") + ("_sink" if sink else ""))
    if fp8kv:
        caches = (TensorSpec("kv_cache", ("num_pages", "page_size", "kv_token_bytes"), "int8",
                             "per token: 512 e4m3, 4 fp32 scales (one per 128), 64 bf16 rope"),)
    else:
        caches = (TensorSpec("ckv_cache", ("num_pages", "page_size", "ckv_dim"), "bfloat16"),
                  TensorSpec("kpe_cache", ("num_pages", "page_size", "kpe_dim"), "bfloat16"))
    inputs = (
        TensorSpec("q_nope", ("num_tokens", "num_qo_heads", "ckv_dim"), "bfloat16"),
        TensorSpec("q_pe", ("num_tokens", "num_qo_heads", "kpe_dim"), "bfloat16"),
        *caches,
        TensorSpec("sparse_indices", ("num_tokens", "topk"), "int32",
                   "flat page*page_size+offset, -1 = padding anywhere"),
        TensorSpec("sm_scale", (), "float32"),
    )
    if topk_length:
        inputs += (TensorSpec("topk_length", ("num_tokens",), "int32", "only the first topk_length[t] indices count"),)
    if sink:
        inputs += (TensorSpec("attn_sink", ("num_qo_heads",), "float32", "out *= 1/(1+exp(sink - lse_e))"),)
    consts = {"num_qo_heads": heads, "ckv_dim": MLA_CKV_DIM, "kpe_dim": MLA_KPE_DIM, "page_size": page_size,
              "topk": topk}
    if fp8kv:
        consts["kv_token_bytes"] = MLA_TOKEN_BYTES
    return Definition(
        name=name,
        op_type="dsa_paged",
        description=(
            f"DSA sparse MLA decode attention, {heads} query heads, one latent KV head "
            f"(d_qk 576, d_v 512), top-{topk} selected tokens, {'FP8 656-byte' if fp8kv else 'bf16'} KV in pages "
            f"of {page_size} tokens, "
            f"base-{'e' if lse_base_e else '2'} LSE" + (", per-row topk_length" if topk_length else "")
            + (", attention sink" if sink else "")
        ),
        const_axes=consts,
        var_axes=("num_tokens", "num_pages"),
        inputs=inputs,
        outputs=(
            TensorSpec("output", ("num_tokens", "num_qo_heads", "ckv_dim"), "bfloat16", "0 for a row with no valid index"),
            TensorSpec("lse", ("num_tokens", "num_qo_heads"), "float32",
                       f"base-{'e' if lse_base_e else '2'} log-sum-exp of the scaled logits; -inf for an empty row"),
        ),
        constraints=("all((sparse_indices == -1) | ((sparse_indices >= 0) & (sparse_indices < num_pages * page_size)))",)
        + (("all((topk_length >= 0) & (topk_length <= topk))",) if topk_length else ()),
        reference=reference,
        params={"heads": heads, "topk": topk, "page_size": page_size, "fp8kv": fp8kv, "lse_base": math.e if lse_base_e else 2.0,
                "has_topk_length": topk_length, "has_sink": sink},
        tags=("stage:attention",) + (("contest",) if name == "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64" else ()),
    )


def parse(name: str) -> Definition | None:
    m = NAME_RE.match(name)
    if not m:
        return None
    return make(int(m.group(1)), int(m.group(2)), bool(m["fp8kv"]), bool(m["lsee"]), bool(m["topklen"]), bool(m["sink"]),
                int(m.group(3)))


def variants() -> list[Definition]:
    return [
        make(h, 2048, fp8, lse_e, tl, sink)
        for h in HEADS for fp8 in (False, True) for lse_e in (False, True) for tl in (False, True) for sink in (False, True)
    ]
