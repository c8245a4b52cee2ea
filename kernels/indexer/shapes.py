"""The indexer shapes the kernels serve and are built for (the definitions' variants take them from here)."""

HEADS = (32, 64)
TOPKS = (512, 1024, 2048)
NEXT_NS = (1, 2, 3, 4)  # query tokens per request (MTP)
PREFILL_DIMS = (32, 64, 128)  # the prefill logits' head dims (fp8 tl.dot needs K >= 32)
