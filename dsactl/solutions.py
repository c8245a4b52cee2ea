"""Solutions: an implementation of one or more definitions, as plain data.

A solution's entry is "module:function"; the function takes the definition's
signature (inputs, then preallocated outputs) and writes the outputs in place.
Kernel authors add their entry to SOLUTIONS.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Callable

from dsactl.definitions.attention import any_page_size
from dsactl.device import has_cuda_gpu
from dsactl.errors import DsactlError
from dsactl.kernels.attention import dispatch
from dsactl.kernels.errors import KernelError


@dataclass(frozen=True)
class Solution:
    name: str
    definitions: tuple[str, ...]  # fnmatch patterns over definition names (attention's at page size 64)
    language: str  # "python" | "triton" | "cuda"
    entry: str  # "package.module:function"
    description: str
    needs_gpu: bool = True
    cuda_libs: tuple[str, ...] = ()  # libraries from `dsactl build` that it loads
    baseline: bool = False  # a comparison point (bench), not a shipped kernel
    capability: tuple[int, int] | None = None  # the one compute capability it runs on (arch-specific code)
    # (definition pattern, entry): for a matching definition, an entry that serves it with fewer files,
    # which a bundle of that definition ships instead of `entry`; the first match wins.
    pack_entries: tuple[tuple[str, str], ...] = ()
    # (definition params, workload params) -> why its kernel does not take such a workload of a definition it
    # serves (limits below the definition's, which verify skips saying so), else None.
    refuses: Callable[[dict, dict], str | None] | None = None

    def serves(self, definition: str) -> bool:
        return any(fnmatch(any_page_size(definition), p) for p in self.definitions)

    def entry_for(self, definition: str) -> str:
        """The entry a bundle of definition ships."""
        return next((entry for pattern, entry in self.pack_entries if fnmatch(any_page_size(definition), pattern)),
                    self.entry)

    def load(self) -> Callable:
        module, _, func = self.entry.partition(":")
        try:
            return getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError) as e:
            raise DsactlError(f"solution {self.name}: cannot load {self.entry} ({e})") from None

    def availability(self) -> tuple[bool, str]:
        """Whether it can run on this machine, and why not."""
        if self.needs_gpu and not has_cuda_gpu():
            return False, "needs a CUDA GPU"
        if self.capability is not None:
            import torch

            have = tuple(torch.cuda.get_device_capability())
            if have != self.capability:
                return False, (f"runs on compute capability {self.capability[0]}.{self.capability[1]} only "
                               f"(this GPU: {have[0]}.{have[1]})")
        if self.cuda_libs:
            from dsactl.kernels.cuda_library import load_library

            for lib in self.cuda_libs:
                try:
                    load_library(lib)
                except KernelError as e:
                    return False, str(e)
        return True, "ok"


def interpretable(s: Solution) -> bool:
    """A pure-Triton solution runs on the CPU under the Triton interpreter when there is no GPU
    (verify turns the interpreter on then); one that loads a CUDA library from `dsactl build` cannot."""
    return s.language == "triton" and not s.cuda_libs and not has_cuda_gpu()


def runs_here(s: Solution) -> tuple[str, str]:
    """Where `dsactl verify` runs it on this machine: ("yes" | "interpreted" | "no", why)."""
    ok, reason = s.availability()
    if ok:
        return "yes", ""
    if interpretable(s):
        return "interpreted", f"{reason}; verify --quick interprets it"
    return "no", reason


# Name suffixes of the sparse attention variants (dsactl/definitions/attention.py); each has its entry.
ATTENTION_VARIANTS = tuple(kv + lse + tl + sink for kv in ("", "_fp8kv") for lse in ("", "_lsee")
                           for tl in ("", "_topklen") for sink in ("", "_sink"))
# The variants the Hopper kernel serves (kernels/attention/dispatch.py: all) and those the small-head kernel
# serves (FP8 KV).
HOPPER_ATTENTION_VARIANTS = ATTENTION_VARIANTS
MMA_ATTENTION_VARIANTS = tuple(v for v in ATTENTION_VARIANTS if v.startswith("_fp8kv"))
ATTENTION_HEADS = (16, 32, 64, 128)
ATTENTION_NAME = "dsa_sparse_attention_h{heads}_ckv512_kpe64_topk*_ps64{variant}"


def _cuda_heads(variant: str) -> tuple[int, ...]:
    """The head counts at which the dispatch may send an attention variant to a CUDA kernel."""
    return ((dispatch.hopper_heads("fp8kv" in variant) if variant in HOPPER_ATTENTION_VARIANTS else ())
            + (dispatch.MMA_HEADS if variant in MMA_ATTENTION_VARIANTS else ()))


PADDED_PAGES = "padded pages, whose token ids are not rows (the Triton kernel's)"


def _hopper_attention_refuses(definition_params: dict, workload_params: dict) -> str | None:
    """The Hopper kernel's limit below the definitions': padded pages must hold a power of two of tokens
    (hopper_mla.page_map); the dispatch sends the rest to the Triton kernel."""
    page_size = definition_params["page_size"]
    if workload_params.get("padded_pages") and page_size & (page_size - 1):
        return f"padded pages of {page_size} tokens, not a power of two (the Triton kernel's)"
    return None


def _mma_attention_refuses(definition_params: dict, workload_params: dict) -> str | None:
    """The small-head kernel's limits below the definitions': token ids that are rows (caches of evenly strided
    pages) and rows of at most MMA_MAX_TOPK ids."""
    if definition_params["topk"] > dispatch.MMA_MAX_TOPK:
        return f"topk over {dispatch.MMA_MAX_TOPK} (the Hopper or Triton kernel's)"
    if workload_params.get("padded_pages"):
        return PADDED_PAGES
    return None


def _triton_only_entries(variant: str) -> tuple[tuple[str, str], ...]:
    """The definitions of an attention variant that the dispatch never sends to a CUDA kernel, each with
    the Triton-only entry, so that their bundles carry no CUDA."""
    entry = f"dsactl.kernels.attention.triton_entries:sparse_attention{variant}"
    heads = [h for h in ATTENTION_HEADS if h not in _cuda_heads(variant)]
    if len(heads) == len(ATTENTION_HEADS):
        return ((ATTENTION_NAME.format(heads="*", variant=variant), entry),)
    return tuple((ATTENTION_NAME.format(heads=h, variant=variant), entry) for h in heads)


def _attention_description(variant: str) -> str:
    cuda = (["the Hopper CUDA kernel at 32-128 heads"]
            if variant in HOPPER_ATTENTION_VARIANTS else []) + (
        ["the small-head CUDA kernel at 16/32 heads from 8-16 tokens"] if variant in MMA_ATTENTION_VARIANTS else [])
    return ((f"on sm_90 {' and '.join(cuda)}, else " if cuda else "")
            + "sparse MLA in Triton: 16-64 heads per program, split-KV sized to fill the SMs, exact fp32 combine"
            + (", FP8 KV dequantized in-kernel" if "fp8kv" in variant else ""))


# The order is meaningful: the first non-baseline solution serving a definition is the one dsactl serves it
# with (the dispatching entry), ahead of the kernels it dispatches to and the alternatives (the fused
# indexer); verify and bench run them in this order and pack packs the first (leading()).
SOLUTIONS: list[Solution] = [
    Solution("dsactl-indexer", ("dsa_topk_indexer_fp8_*",), "triton",
             "dsactl.kernels.indexer.solution:dsa_topk_indexer",
             "FP8 paged scoring in Triton (wgmma, fp32 scores) + the exact CUDA top-k with page "
             "translation; structural passthrough when every row fits in top-k", cuda_libs=("topk",)),
    Solution("dsactl-indexer-fused", ("dsa_topk_indexer_fp8_*",), "cuda",
             "dsactl.kernels.indexer.solution:dsa_topk_indexer_fused",
             "scoring and top-k in one CUDA kernel for block tables up to 128 pages (a cluster per row: "
             "wgmma e4m3 on sm_90a, the select on its first CTA; no scores in memory), dsactl-indexer's "
             "kernels past that", cuda_libs=("topk", "indexer_topk")),
    Solution("torch-indexer", ("dsa_topk_indexer_fp8_*",), "python",
             "dsactl.kernels.indexer.torch_baseline:dsa_topk_indexer_torch",
             "vectorized PyTorch: gather pages, einsum, torch.topk", needs_gpu=False, baseline=True),
    Solution("dsactl-prefill-indexer", ("dsa_prefill_indexer_fp8_*",), "triton",
             "dsactl.kernels.indexer.prefill_topk:dsa_prefill_indexer",
             "ragged FP8 logits in Triton (wgmma, fp32), each row over its own key range, in row chunks of at most "
             "1 GiB, then the exact CUDA top-k of each row, key ids", cuda_libs=("topk",)),
    Solution("dsactl-prefill-indexer-fused", ("dsa_prefill_indexer_fp8_*",), "triton",
             "dsactl.kernels.indexer.prefill_fused:dsa_prefill_indexer_fused",
             "ragged FP8 logits in Triton with each row's top-k kept on the fly (packed logit and id above the "
             "row's threshold, cut to the best topk when a list fills): no logits in memory, key ids"),
    Solution("dsactl-topk", ("dsa_topk_page_transform_topk*_ps64*",), "cuda",
             "dsactl.kernels.topk.launcher:dsa_topk_page_transform",
             "exact radix select (11-bit shared-memory histograms, cluster-split rows, candidate "
             "compaction with a global-memory fallback) fused with page translation", cuda_libs=("topk",)),
    Solution("torch-topk", ("dsa_topk_page_transform_*",), "python",
             "dsactl.kernels.topk.torch_baseline:topk_page_transform",
             "vectorized PyTorch: one torch.topk over all rows, then page translation", needs_gpu=False, baseline=True),
    *(Solution(f"dsactl-attention{v.replace('_', '-')}", (f"dsa_sparse_attention_h*_ckv512_kpe64_topk*_ps64{v}",),
               "triton", f"dsactl.kernels.attention.solution:sparse_attention{v}", _attention_description(v),
               pack_entries=_triton_only_entries(v))
      for v in ATTENTION_VARIANTS),
    *(Solution(f"dsactl-attention-hopper{v.replace('_', '-')}",
               tuple(f"dsa_sparse_attention_h{h}_ckv512_kpe64_topk*_ps64{v}" for h in dispatch.hopper_heads("fp8kv" in v)),
               "cuda", f"dsactl.kernels.attention.hopper_mla:sparse_attention{v}",
               "sparse MLA for sm_90a in CUDA: warp-specialized (a gather producer, two wgmma consumer "
               "warpgroups splitting the output columns), mbarrier ring, split-KV + the Triton combine; under "
               "64 heads a 64-row tile on zero q rows"
               + (", FP8 KV dequantized to fp16 by the producer" if "fp8kv" in v else ""),
               cuda_libs=("hopper_mla",), capability=(9, 0), refuses=_hopper_attention_refuses)
      for v in HOPPER_ATTENTION_VARIANTS),
    *(Solution(f"dsactl-attention-mma{v.replace('_', '-')}",
               tuple(f"dsa_sparse_attention_h{h}_ckv512_kpe64_topk*_ps64{v}" for h in dispatch.MMA_HEADS),
               "cuda", f"dsactl.kernels.attention.mma_mla:sparse_attention{v}",
               "sparse MLA at 16/32 heads with FP8 KV in CUDA: mma.sync, a bulk-copy ring of gathered rows two "
               "CTAs an SM, e4m3 fed to fp16 MMAs with the scales applied to logits and P, split-KV + the Triton "
               "combine", cuda_libs=("mma_mla",), capability=(9, 0), refuses=_mma_attention_refuses)
      for v in MMA_ATTENTION_VARIANTS),
    *(Solution(f"torch-attention{v.replace('_', '-')}", (f"dsa_sparse_attention_h*_ckv512_kpe64_topk*_ps64{v}",),
               "python", f"dsactl.kernels.attention.torch_baseline:torch_sparse_attention{v}",
               "vectorized PyTorch: gather, einsum, masked softmax", needs_gpu=False, baseline=True)
      for v in ("", "_fp8kv")),
]


def get(name: str) -> Solution:
    for s in SOLUTIONS:
        if s.name == name:
            return s
    raise DsactlError(f"unknown solution {name!r}; `dsactl list` shows them ({', '.join(s.name for s in SOLUTIONS)})")


def for_definition(definition: str, include_baselines: bool = False) -> list[Solution]:
    return [s for s in SOLUTIONS if s.serves(definition) and (include_baselines or not s.baseline)]


def leading(definition: str) -> Solution:
    """The solution dsactl serves definition with: the first of for_definition."""
    serving = for_definition(definition)
    if not serving:
        raise DsactlError(f"no solution serves {definition}; `dsactl list` shows which serve what")
    return serving[0]
