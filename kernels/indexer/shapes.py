"""The indexer shapes the kernels serve and are built for (the definitions' variants take them from here)."""

HEADS = (32, 64)
TOPKS = (512, 1024, 2048)
NEXT_NS = (1, 2, 3, 4)  # query tokens per request (MTP)
