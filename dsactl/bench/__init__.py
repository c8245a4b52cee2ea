"""dsactl bench: kernel latency from CUPTI records, speedups over the reference and
baselines, achieved bandwidth and FLOP rates against measured peaks, regression
tracking. `runner.bench` is the entry point; the CLI only parses and renders."""
