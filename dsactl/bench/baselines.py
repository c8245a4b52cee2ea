"""What bench times besides the solutions: the reference, baseline solutions, plug-ins.

A Contender is anything bench can time on a prepared call: `bind(call)` does the
per-trial setup outside the timed region (layout conversions a plug-in needs,
loading the solution) and returns the zero-argument callable that is timed.

The reference (the definition's float32 PyTorch loop, the contest's baseline and
the denominator of every speedup) is always timed unless --no-reference. --baseline
names pick among the others (default: all that serve the definition):
  <solution>    a registered Solution with baseline=True (e.g. torch-topk)
  flashinfer    FlashInfer's top_k_page_table_transform (top-k definitions)
  flashmla      FlashMLA's sparse attention (attention definitions): its decode kernel for FP8 KV, its
                prefill kernel for bf16 KV; under 64 heads q is padded to 64 heads, as engines do
  flashmla-upconvert  FlashMLA's prefill path on an FP8 cache as engines run it (FP8 KV definitions of 64-token
                pages): the cache upconverted to bf16 rows, then its bf16 prefill kernel, both in the timed call
  deepgemm      DeepGEMM's ragged FP8 logits (fp8_mqa_logits, compressed rows) under this project's chunked
                exact top-k (prefill indexer definitions): the logits-then-top-k path engines run, with the
                chunks and the top-k of dsactl-prefill-indexer, so the two differ only in the logits kernel
  dsactl-padded64  this project's attention on q padded to 64 heads (definitions under 64 heads): what
                padding would cost here, beside the native kernels
  dsactl-hopper, dsactl-mma, dsactl-triton  this project's attention with one kernel forced, wherever that
                kernel takes the definition's heads and KV format: the dispatch's choice against each
                alternative (the `dispatch` suite, profiles/reproduce.sh area dispatch)
A plug-in that is not importable here, or (deepgemm) whose first call fails or crashes a child process
(dsactl.probe), is listed as skipped with the reason, never an error.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dsactl import probe, solutions
from dsactl.definitions import Definition
from dsactl.errors import DsactlError
from dsactl.fp8 import MLA_CKV_DIM, PAGE_SIZE
from dsactl.bench.metrics import stage
from dsactl.harness import Call

REFERENCE = "reference"


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "solution" | "baseline" | "reference" | "plugin"
    bind: Callable[[Call], Callable[[], Any]]
    entry: Callable | None = None  # the solution's function, for its optional grid_ctas
    solution: solutions.Solution | None = None  # the registered solution it times, if any


@dataclass(frozen=True)
class Skipped:
    name: str
    kind: str
    definition: str
    reason: str
    workload: str = ""  # empty: skipped for every workload of the definition


def solution_contender(s: solutions.Solution) -> Contender:
    fn = s.load()
    return Contender(s.name, "baseline" if s.baseline else "solution",
                     lambda call: functools.partial(fn, *call.args()), fn, s)


def reference_contender() -> Contender:
    def bind(call: Call) -> Callable[[], Any]:
        return functools.partial(call.definition.run_reference, call.inputs)

    return Contender(REFERENCE, "reference", bind)


def _flashinfer_topk(module: Any, call: Call) -> Callable[[], Any]:
    """FlashInfer gathers through a per-token table [batch, max_len]; expand the page table once."""
    x = call.inputs
    scores, table = x["scores"], x["block_table"]
    max_len = scores.shape[1]
    tokens = (table.long()[:, :, None] * PAGE_SIZE + torch.arange(PAGE_SIZE, device=table.device)).flatten(1)
    if tokens.shape[1] < max_len:  # positions past the table are beyond every row's length: never selected
        tokens = torch.nn.functional.pad(tokens, (0, max_len - tokens.shape[1]))
    tokens = tokens[:, :max_len].to(torch.int32).contiguous()
    k = call.definition.params["topk"]
    return functools.partial(module.top_k_page_table_transform, scores, tokens, x["lengths"], k, x["row_to_batch"])


FLASHMLA_HEADS = (64, 128)  # the head counts FlashMLA's sparse kernels take on sm_90


def _flashmla_q(x: dict, heads: int) -> torch.Tensor:
    """q [T, H', 576] with H' the FlashMLA head count at or above `heads`: under 64 heads the extra heads are
    zeros, as serving engines pad tensor-parallel shards (16 or 32 heads) today. Padding happens here, outside
    the timed call, so the baseline pays only its kernel."""
    q = torch.cat([x["q_nope"], x["q_pe"]], dim=-1)
    padded = next(h for h in FLASHMLA_HEADS if h >= heads)
    return torch.nn.functional.pad(q, (0, 0, 0, padded - heads)).contiguous()


def _flashmla_args(call: Call) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """What every FlashMLA call takes of the definition's: q padded to its heads, the ids as [T, 1, topk], and the
    optional arguments (topk_length, the sink padded to q's heads)."""
    x, d = call.inputs, call.definition
    q = _flashmla_q(x, d.params["heads"])
    extra = {}
    if d.params["has_topk_length"]:
        extra["topk_length"] = x["topk_length"]
    if d.params["has_sink"]:
        extra["attn_sink"] = torch.nn.functional.pad(x["attn_sink"], (0, q.shape[1] - d.params["heads"]))
    return q, x["sparse_indices"].unsqueeze(1).contiguous(), extra


def _flashmla_attention(module: Any, call: Call) -> Callable[[], Any]:
    """FP8 KV: the sparse decode kernel, each query token one batch entry of one query (q [T, 1, H, 576], the
    656-byte cache as [pages, 64, 1, 656] e4m3 bytes, indices [T, 1, topk]). bf16 KV: the sparse prefill kernel
    (`flash_mla_sparse_fwd`, the only FlashMLA kernel that reads bf16 sparse KV), over ckv and kpe concatenated
    into one [tokens, 1, 576] cache once, outside the timed call."""
    x, d = call.inputs, call.definition
    q, indices, extra = _flashmla_args(call)
    if not d.params["fp8kv"]:
        kv = torch.cat([x["ckv_cache"], x["kpe_cache"]], dim=-1).flatten(0, 1).unsqueeze(1).contiguous()
        return functools.partial(module.flash_mla_sparse_fwd, q, kv, indices, x["sm_scale"], MLA_CKV_DIM, **extra)
    q = q.unsqueeze(1)
    kv = x["kv_cache"].view(torch.float8_e4m3fn).unsqueeze(2)
    seqlens = torch.full((q.shape[0],), d.params["topk"], dtype=torch.int32, device=q.device)
    meta, splits = module.get_mla_metadata(seqlens, q.shape[2], 1, q.shape[2], True, d.params["topk"])
    return functools.partial(module.flash_mla_with_kvcache, q, kv, None, seqlens, MLA_CKV_DIM, meta, splits,
                             softmax_scale=x["sm_scale"], is_fp8_kvcache=True, indices=indices, **extra)


def _flashmla_upconvert(module: Any, call: Call) -> Callable[[], Any]:
    """FP8 KV the way engines feed FlashMLA's bf16-only prefill kernel (vLLM's flashmla_sparse backend: "upconvert
    the FP8 cache to BF16, then the prefill kernel"): the whole cache to bf16 rows [tokens, 1, 576] by a
    bandwidth-bound Triton kernel (fp8_staging.upconvert), then flash_mla_sparse_fwd; both are timed."""
    from dsactl.kernels.attention import fp8_staging

    x = call.inputs
    q, indices, extra = _flashmla_args(call)

    def run():
        kv = fp8_staging.upconvert(x["kv_cache"]).unsqueeze(1)
        return module.flash_mla_sparse_fwd(q, kv, indices, x["sm_scale"], MLA_CKV_DIM, **extra)
    return run


def _upconvert_serves(d: Definition) -> bool:
    """FP8 KV of 64-token pages (each id a row of the upconverted cache) at heads FlashMLA takes, padded or not."""
    return (stage(d) == "attention" and d.params["fp8kv"] and d.params["page_size"] == PAGE_SIZE
            and d.params["heads"] <= max(FLASHMLA_HEADS))


PADDED_HEADS = 64  # our 64-head path (the Hopper kernel on sm_90): what padding a shard would cost here


def _padded_attention(module: Any, call: Call) -> Callable[[], Any]:
    """This project's attention dispatch on q padded with zero heads to PADDED_HEADS (outside the timed call),
    writing [T, 64, ...] outputs: the padded alternative to the native 16/32-head kernels, timed on the same
    tokens."""
    x, d = call.inputs, call.definition
    pad = PADDED_HEADS - d.params["heads"]
    q_nope, q_pe = (torch.nn.functional.pad(x[k], (0, 0, 0, pad)).contiguous() for k in ("q_nope", "q_pe"))
    output = torch.empty(*q_nope.shape[:2], MLA_CKV_DIM, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.empty(q_nope.shape[:2], dtype=torch.float32, device=q_nope.device)
    extra = {k: x[k] for k in ("ckv_cache", "kpe_cache", "kv_cache", "topk_length") if k in x}
    if "attn_sink" in x:
        extra["attn_sink"] = torch.nn.functional.pad(x["attn_sink"], (0, pad))
    return functools.partial(module.sparse_mla_attention, q_nope, q_pe, x["sparse_indices"], x["sm_scale"], output,
                             lse, lse_base_e=d.params["lse_base"] != 2.0, **extra)


def _deepgemm_prefill_indexer(module: Any, call: Call) -> Callable[[], Any]:
    """DeepGEMM's fp8_mqa_logits for each chunk of rows (compressed: max_seqlen_k is the chunk's width), then
    the chunked path's own top-k."""
    from dsactl.kernels.indexer import prefill_topk

    def row_logits(q, k, k_scale, weights, start, end, width):
        return module.fp8_mqa_logits(q, (k, k_scale), weights, start, end, clean_logits=False, max_seqlen_k=width)

    x = call.inputs
    return functools.partial(prefill_topk.prefill_topk, x["q_index_fp8"], x["k_index_fp8"], x["k_index_scale"],
                             x["weights"], x["ks"], x["ke"], call.outputs["topk_indices"], row_logits=row_logits)


def _forced_attention(implementation: str, module: Any, call: Call) -> Callable[[], Any]:
    """This project's attention entry with the kernel forced, on the definition's own tensors."""
    x, out, d = call.inputs, call.outputs, call.definition
    extra = {k: x[k] for k in ("ckv_cache", "kpe_cache", "kv_cache", "topk_length", "attn_sink") if k in x}
    return functools.partial(module.sparse_mla_attention, x["q_nope"], x["q_pe"], x["sparse_indices"], x["sm_scale"],
                             out["output"], out["lse"], lse_base_e=d.params["lse_base"] != 2.0,
                             implementation=implementation, **extra)


def _forced_serves(implementation: str, d: Definition) -> bool:
    """Whether the forced kernel takes the definition's heads and KV format at all (the dispatch's thresholds
    and limits aside): the Hopper kernel every head count it tiles without topk_length or a sink, the small-head
    kernel FP8 KV at 16/32 heads, the Triton kernel everything."""
    if stage(d) != "attention":
        return False
    from dsactl.kernels.attention import dispatch

    heads, fp8 = d.params["heads"], d.params["fp8kv"]
    plain = not (d.params["has_topk_length"] or d.params["has_sink"])
    return {dispatch.HOPPER: heads in dispatch.HOPPER_HEADS and plain,
            dispatch.MMA: heads in dispatch.MMA_HEADS and fp8, dispatch.TRITON: True}[implementation]


@dataclass(frozen=True)
class Plugin:
    name: str
    module: str
    serves: Callable[[Definition], bool]
    adapter: Callable[[Any, Call], Callable[[], Any]]
    first_call: str = ""  # code making a first call in a child process, before this one makes any (dsactl.probe)

    def contender(self) -> Contender:
        """The contender, or DsactlError saying why it cannot run here."""
        if not torch.cuda.is_available():
            raise DsactlError("needs a CUDA GPU")
        try:
            module = importlib.import_module(self.module)
        except Exception as e:  # not installed, or built for another CUDA/torch
            raise DsactlError(f"cannot import {self.module} ({type(e).__name__}: {e})") from None
        why = probe.cached_failure(self.first_call) if self.first_call else ""
        if why:
            raise DsactlError(f"{self.module} imports, but {why}")
        return Contender(self.name, "plugin", functools.partial(self.adapter, module))


PLUGINS = (
    Plugin("flashinfer", "flashinfer", lambda d: stage(d) == "topk", _flashinfer_topk),
    Plugin("flashmla", "flash_mla",
           lambda d: stage(d) == "attention" and d.params["heads"] <= max(FLASHMLA_HEADS), _flashmla_attention),
    Plugin("flashmla-upconvert", "flash_mla", _upconvert_serves, _flashmla_upconvert),
    Plugin("deepgemm", "deep_gemm", lambda d: stage(d) == "prefill_indexer", _deepgemm_prefill_indexer,
           probe.DEEP_GEMM),
    Plugin("dsactl-padded64", "dsactl.kernels.attention.solution",
           lambda d: stage(d) == "attention" and d.params["heads"] < PADDED_HEADS, _padded_attention),
    *(Plugin(f"dsactl-{impl}", "dsactl.kernels.attention.solution", functools.partial(_forced_serves, impl),
             functools.partial(_forced_attention, impl)) for impl in ("hopper", "mma", "triton")),
)


def serves(name: str, d: Definition) -> bool:
    """Whether the named baseline (a baseline solution or a plug-in, not the reference) serves definition d;
    needs no GPU and imports no plug-in."""
    for s in solutions.SOLUTIONS:
        if s.baseline and s.name == name:
            return s.serves(d.name)
    for p in PLUGINS:
        if p.name == name:
            return p.serves(d)
    raise DsactlError(f"unknown baseline {name!r}; choose from {', '.join(known_names()[1:])}")


def known_names() -> list[str]:
    return [REFERENCE] + [s.name for s in solutions.SOLUTIONS if s.baseline] + [p.name for p in PLUGINS]


def check_names(names: list[str], accepted: list[str] | None = None) -> None:
    """Refuse a name outside accepted (default: every known baseline), listing those accepted."""
    accepted = known_names() if accepted is None else accepted
    unknown = [n for n in names if n not in accepted]
    if unknown:
        raise DsactlError(f"unknown baseline {', '.join(map(repr, unknown))}; choose from {', '.join(accepted)}")


def resolve(d: Definition, names: list[str] | None = None,
            include_reference: bool = True) -> tuple[list[Contender], list[Skipped]]:
    """Baselines for one definition: the reference (unless include_reference is False),
    then with names None every baseline solution and plug-in serving it, otherwise
    exactly the named ones (naming "reference" changes nothing)."""
    if names is not None:
        check_names(names)
    wanted = (lambda n: True) if names is None else (lambda n: n in names)
    found: list[Contender] = [reference_contender()] if include_reference else []
    skipped: list[Skipped] = []
    for s in solutions.SOLUTIONS:
        if not (s.baseline and wanted(s.name)):
            continue
        if not s.serves(d.name):
            if names is not None:
                skipped.append(Skipped(s.name, "baseline", d.name, "does not serve this definition"))
            continue
        ok, why = s.availability()
        if not ok:
            skipped.append(Skipped(s.name, "baseline", d.name, why))
            continue
        try:
            found.append(solution_contender(s))
        except DsactlError as e:
            skipped.append(Skipped(s.name, "baseline", d.name, str(e)))
    for p in PLUGINS:
        if not wanted(p.name):
            continue
        if not p.serves(d):
            if names is not None:
                skipped.append(Skipped(p.name, "plugin", d.name, "does not serve this definition"))
            continue
        try:
            found.append(p.contender())
        except DsactlError as e:
            skipped.append(Skipped(p.name, "plugin", d.name, str(e)))
    return found, skipped
