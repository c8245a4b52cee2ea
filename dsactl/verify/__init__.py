"""dsactl verify: correctness sweeps with the contest's rules.

rules   the comparison rules (dense tolerance, top-k set semantics), one Verdict per call
runner  (solution, workload) pairs, fresh inputs per trial, poisoned outputs, results as data
repro   a failing case as a one-line command and a one-workload dataset
sanitize  compute-sanitizer memcheck/racecheck over the same calls, errors per kernel
"""
