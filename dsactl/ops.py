"""What a serving engine imports: `import dsactl.ops` registers the torch ops (torch.ops.dsactl.*) and
gives their handles, DecodeStep and PrefillStep, the device counters of masked ids and the errors the kernels
raise.

    import dsactl.ops
    step = dsactl.ops.DecodeStep(batch=32, max_context=32768, heads=128, kv_format="fp8", device="cuda")
    counters = dsactl.ops.bad_index_counters("cuda")  # live int32 tensors by stage: read when you choose

The ops are documented in kernels/ops.py, the steps in kernels/step.py and kernels/prefill_step.py.
`import dsactl` alone imports neither torch nor this module, so the command line starts fast.
"""

from dsactl.kernels.errors import KernelBuildError, KernelError, KernelInputError
from dsactl.kernels.ops import (bad_index_counters, indexer_topk, indexer_topk_out, prefill_topk, prefill_topk_out,
                                reset_bad_index_counters, sparse_mla_decode, sparse_mla_decode_out)
from dsactl.kernels.prefill_step import PrefillStep
from dsactl.kernels.step import DecodeStep

__all__ = ["DecodeStep", "KernelBuildError", "KernelError", "KernelInputError", "PrefillStep", "bad_index_counters",
           "indexer_topk", "indexer_topk_out", "prefill_topk", "prefill_topk_out", "reset_bad_index_counters",
           "sparse_mla_decode", "sparse_mla_decode_out"]
