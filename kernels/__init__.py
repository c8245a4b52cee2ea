"""The DSA kernels, one package per stage (indexer, topk, attention): each holds its contract, kernels
and launcher. They import only torch, triton, the standard library and each other (relatively), so a
copy of the files a launcher runs works anywhere: dsactl imports them, never the reverse."""
