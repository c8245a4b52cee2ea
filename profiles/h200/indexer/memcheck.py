"""Calls for compute-sanitizer memcheck: the solution on a scored and a passthrough contest
workload and the MTP edge workload, and both pipeline configurations forced on a var-len MTP
batch whose block table is padded with -1 (entries past a row's pages must never be dereferenced).

  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \\
      python3 profiles/h200/indexer/memcheck.py
"""

import torch

from dsactl.definitions import get
from dsactl.fp8 import PAGE_SIZE
from dsactl.harness import prepare
from dsactl.kernels.indexer.score import choose_config, score
from dsactl.kernels.indexer.solution import dsa_topk_indexer
from dsactl.workloads import Workload, make_inputs, suite

for uuid in ("contest-indexer-090", "contest-indexer-000", "edge-indexer-nextn4"):
    w = next(w for w in suite("all") if w.uuid == uuid)
    call = prepare(w, "cuda", seed=0)
    dsa_topk_indexer(*call.args())
    torch.cuda.synchronize()
    print(uuid, "ok", flush=True)

seq_lens = (5000, 3, 700, 2049)
name = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64_nextn3"
get(name)
pages = [-(-s // PAGE_SIZE) for s in seq_lens]
w = Workload("memcheck", name, "memcheck", "memcheck",
             {"batch_size": len(seq_lens), "num_pages": sum(pages) + 8, "max_num_pages": max(pages) + 3},
             {"seq_lens": seq_lens, "table_pad": -1})
inputs = make_inputs(w, "cuda", 0)
width = inputs["block_table"].shape[1] * PAGE_SIZE
for large in (False, True):
    scores = torch.empty(len(seq_lens) * 3, width, device="cuda")
    lengths = torch.empty(len(seq_lens) * 3, dtype=torch.int32, device="cuda")
    score(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"],
          inputs["block_table"], scores, lengths, skip_len=512,
          config=choose_config(len(seq_lens), 3, 64, width, large=large))
    torch.cuda.synchronize()
    print("var-len next_n=3 large" if large else "var-len next_n=3", "ok", flush=True)
