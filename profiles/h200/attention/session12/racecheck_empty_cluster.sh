#!/usr/bin/env bash
# racecheck, RUNS times (default 3), on the bf16 cases where session 12's Q-by-TMA run reported a race in the
# cp.async bf16 kernel (README.md here), with the carried build; on the H200, carrying ["build/sm90a"]:
#   bash profiles/h200/attention/session12/racecheck_empty_cluster.sh
# (Session 12 ran it before the patch landed, on the previous library and then on the patched one.)
export PYTHONPATH=$PWD; . profiles/h200/cupti_env.sh
C="128-1024-2-bf16-2-empty-cluster 128-1024-2-bf16-2-empty 64-2048-2-bf16-2-scattered"
for i in $(seq "${RUNS:-3}"); do
  echo "== run $i"
  compute-sanitizer --tool racecheck --error-exitcode 1 python3 profiles/h200/attention/hopper_check.py $C 2>&1 |
    grep -E "^==|Race|SUMMARY" | cut -c1-220
done
