#!/usr/bin/env bash
# The H200 session that produced everything under profiles/h200/.
# Run from the repository root on the GPU machine (no install needed: the
# checkout imports as is, with the image's torch/triton):
#   bash profiles/h200/run.sh check OUTDIR   # doctor, GPU tests, verify contest/edge/scale, sanitizer, bundles
#   bash profiles/h200/run.sh perf  OUTDIR   # benches (contest + scale), ncu profiles (contest + largest scale)
#   bash profiles/h200/run.sh followup OUTDIR  # after the indexer config change: its tests, old vs new, sanitizer
#   bash profiles/h200/run.sh hopper OUTDIR    # the Hopper attention kernel: GPU tests, bench vs Triton, sanitizers, ncu
#   bash profiles/h200/run.sh hopper-ab OUTDIR # the Hopper kernel against a variant build (.carry/hopper_b),
#     then the variant's tests and sanitizers
#   bash profiles/h200/run.sh indexer-topk OUTDIR  # after the top-k work: indexer contest bench, verify, e2e
#   bash profiles/h200/run.sh hopper-quick OUTDIR  # a Hopper kernel change: whole GPU suite, sanitizers, bench
#   bash profiles/h200/run.sh hopper-dev OUTDIR    # a Hopper kernel change under way: its tests, sanitizers,
#     bench against the previous build (.carry/hopper_b, here the old code rather than a variant)
#   bash profiles/h200/run.sh attention OUTDIR     # a change both attention kernels share (the combine, the
#     split choice): every GPU test, the contest bench, Hopper vs Triton, sanitizers, verify
#   bash profiles/h200/run.sh triton-dev OUTDIR    # a Triton attention launcher change: its tests, sanitizers,
#     contest + production against the previous launcher (.carry/triton_old), combine variants
#   bash profiles/h200/run.sh scratch-tests OUTDIR # the stream / graph tests of the per-call scratch on this
#     tree (expected to pass), then on the kernels before it (expected to fail), carried in .carry/old_scratch
#     (`git show 4d214d4:kernels/attention/triton_sparse_mla.py` etc.; copied over the kernels, so it runs last)
#   bash profiles/h200/run.sh cluster OUTDIR       # the Hopper splits merged in a cluster: the kernel's tests,
#     sanitizers on cluster-merged cases, both merges side by side (attention/bench_cluster.py)
#   bash profiles/h200/run.sh session9 OUTDIR      # every GPU test, the Hopper sanitizers, the Hopper kernel
#     against the session's starting build (.carry/head: 7596cd8 with this ABI), then scratch-tests' old run
#   bash profiles/h200/run.sh session11 OUTDIR     # the experiments prepared in sessions 10-11 in one call (below;
#     its carried files from attention/session11/prepare_carry.sh)
#   bash profiles/h200/run.sh session12 OUTDIR     # every GPU test, the Triton sanitizers, Hopper vs Triton
#   bash profiles/h200/run.sh session13 OUTDIR     # the Hopper kernel's bf16 partials against the previous commit
#     (attention/session13/ab.sh), every GPU test, the Hopper sanitizers, session 12's racecheck repeat;
#     then the combine's launches for bf16 partials the same way
#   (builds are compared by attention/bench_builds.sh, one process per build)
#     (its logs and CSV of session 4 are in attention/, named s4v3: a variant measured and dropped)
# The build is made beforehand (`dsactl build --arch sm90a`, same nvcc 13.0) and
# carried. CUPTI timing uses the cupti-python wheel when one is carried in .carry/.
# Everything lands in profiles/h200/, returned as OUTDIR/results-MODE.tgz. SKIP="STEP ..." leaves those steps out
# (their names as the step lines print them), e.g. steps an earlier call already ran on the same build.
set -uo pipefail
MODES="check|perf|followup|hopper|hopper-ab|indexer-topk|hopper-quick|hopper-dev|triton-dev|attention|scratch-tests|cluster|session9|fp16-range|fp16-range-ab|session10|q-path|session11|session12|session13"
MODE=${1:?usage: run.sh $MODES OUTDIR}
OUT=${2:-/tmp/dsactl-h200}
P=profiles/h200
LOGS=$(mktemp -d)
mkdir -p "$OUT" "$P"
export PYTHONUNBUFFERED=1 COLUMNS=200 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
DSACTL="python3 -m dsactl"
. profiles/h200/cupti_env.sh

step() {  # step NAME SECONDS CMD...: run with a time limit, log to profiles/h200/logs-MODE-NAME.txt
  local name=$1 limit=$2; shift 2
  case " ${SKIP:-} " in *" $name "*) echo "$name skipped (SKIP)"; return 0;; esac
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  printf '%-24s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -v '^\s*$' "$LOGS/$name.log" | tail -1 | cut -c1-140)"
  cp "$LOGS/$name.log" "$P/logs-$MODE-$name.txt"
  tar czf "$OUT/results-$MODE.tgz" "$P" 2>/dev/null  # refreshed per step: a cut-off run still returns what it made
}

sanitize_hopper() {  # sanitize_hopper PREFIX: memcheck, racecheck, synccheck on 128-head FP8 and bf16 split cases,
  # two of them with grids over half the SMs (the partials staged through shared memory, clustered FP8),
  # and two splits merged in a cluster
  for tool in memcheck racecheck synccheck; do
    step "$1-$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      python3 $P/attention/hopper_check.py 128-256-2-fp8-3-scattered 64-128-1-bf16-1-full \
      128-1024-5-fp8-8-scattered 64-1024-9-bf16-8-scattered 64-1024-3-bf16-2-scattered 64-512-2-fp8-2-full
  done
}

if [ "$MODE" = check ]; then
  step doctor 30 $DSACTL doctor --json "$P/doctor.json"
  cp "$LOGS/doctor.log" "$P/doctor.txt"
  step pytest-gpu 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/test_attention_hopper.py
  # The Hopper kernel has never run (issue 7): its own step, so a hang cannot cost the others their results.
  step pytest-hopper 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_attention_hopper.py
  step verify-contest 80 $DSACTL verify --suite contest --trials 1 --json "$P/verify-contest.json"
  step verify-edge 40 $DSACTL verify --suite edge --trials 1 --json "$P/verify-edge.json"
  step verify-scale 60 $DSACTL verify --suite scale --trials 1 --json "$P/verify-scale.json"
  # One workload per kernel under memcheck + racecheck (the sanitizer multiplies run time ~100x).
  step verify-sanitize 90 $DSACTL verify --suite all --trials 1 --sanitize --json "$P/verify-sanitize.json" \
    -w contest-indexer-070 -w contest-attention-001 -w scale-attention-h64-t8-fp8 -w scale-topk-r8-len32768-bf16
  # Each bundle is unpacked by verify --bundle into an empty temporary folder outside the repository.
  mkdir -p "$P/pack"
  for d in dsa_topk_indexer_fp8_h64_d128_topk2048_ps64 dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64 \
           dsa_topk_page_transform_topk2048_ps64; do
    suite=contest; [ "${d#dsa_topk_page}" != "$d" ] && suite=edge
    step "pack-$d" 15 $DSACTL pack -d "$d" -o "$LOGS/$d.json"
    step "bundle-$d" 40 $DSACTL verify --bundle "$LOGS/$d.json" --suite "$suite" --trials 1 --json "$P/pack/verify-$d.json"
  done
elif [ "$MODE" = hopper ]; then
  # The Hopper kernel's own tests first and alone: a hang (the FP8 register split once did) costs only them.
  step pytest-hopper 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py
  step bench-hopper 120 python3 $P/attention/bench_hopper.py "$P/attention"
  step pytest-gpu 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/test_attention_hopper.py
  sanitize_hopper hopper
  step ncu-hopper 45 bash $P/attention/ncu_hopper.sh "$P/attention"
  step verify-hopper 60 $DSACTL verify --suite all -d 'dsa_sparse_attention_h*' --trials 1 \
    -s dsactl-attention-hopper -s dsactl-attention-hopper-lsee -s dsactl-attention-hopper-fp8kv \
    --json "$P/attention/verify-hopper.json"
elif [ "$MODE" = hopper-ab ]; then
  # The shipped Hopper kernel against a variant build (.carry/hopper_b/libhopper_mla.so, made from a
  # patch saved beside it), then the GPU tests on the variant (its .so put in place of the build's).
  step pytest-hopper 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py
  step bench-builds 200 bash $P/attention/bench_builds.sh "$P/attention/builds-ab" \
    shipped=build/sm90a/libhopper_mla.so variant=.carry/hopper_b/libhopper_mla.so shipped2=build/sm90a/libhopper_mla.so
  cp .carry/hopper_b/libhopper_mla.so build/sm90a/libhopper_mla.so
  step pytest-hopper-variant 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py
  sanitize_hopper variant
elif [ "$MODE" = hopper-quick ]; then
  # The shipped build after a Hopper kernel change: every GPU test, the three sanitizers, the bench
  # against Triton (no variant).
  step pytest-gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  sanitize_hopper hopper-quick
  step bench-hopper 120 python3 $P/attention/bench_hopper.py "$P/attention"
elif [ "$MODE" = triton-dev ]; then
  # A Triton attention launcher change: its GPU tests, sanitizers on its split layouts, the contest
  # and production shapes against the previous launcher (.carry/triton_old/old_sparse_mla.py, in the
  # same process), the combine tile variants.
  step pytest-attention 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py
  step triton-memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 \
    python3 $P/attention/sanitize_attention.py all
  step triton-racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 $P/attention/sanitize_attention.py contest small_grid
  step old-vs-new 150 python3 $P/attention/bench_old_vs_new.py .carry/triton_old/old_sparse_mla.py \
    "$P/attention/triton-dev"
  step combine-variants 120 python3 $P/attention/triton_variants.py "$P/attention/triton-dev" combine
elif [ "$MODE" = attention ]; then
  # Steps in order of what a cut-off run can least afford to lose.
  step pytest-gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  step bench-contest-attention 60 $DSACTL bench --suite contest -d 'dsa_sparse_attention*' --trials 2 --iters 20 \
    --csv "$P/bench-contest-attention.csv" --plot "$P/plots-contest-attention"
  step bench-hopper 120 python3 $P/attention/bench_hopper.py "$P/attention"
  step triton-memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 \
    python3 $P/attention/sanitize_attention.py all
  step triton-racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 $P/attention/sanitize_attention.py contest small_grid fp8_variant
  step verify-contest-attention 80 $DSACTL verify --suite contest -d 'dsa_sparse_attention*' --trials 1 \
    --json "$P/verify-contest-attention.json"
  step verify-hopper 60 $DSACTL verify --suite all -d 'dsa_sparse_attention_h*' --trials 1 \
    -s dsactl-attention-hopper -s dsactl-attention-hopper-lsee -s dsactl-attention-hopper-fp8kv \
    --json "$P/attention/verify-hopper.json"
  step hopper-memcheck 50 compute-sanitizer --tool memcheck --error-exitcode 1 \
    python3 $P/attention/hopper_check.py 128-256-2-fp8-3-scattered 64-128-1-bf16-1-full
elif [ "$MODE" = scratch-tests ]; then
  SCRATCH_TESTS=(tests/test_attention.py tests/test_indexer.py -k "streams or graph")
  step scratch-tests-new 120 python3 -m pytest -q -m gpu -p no:cacheprovider "${SCRATCH_TESTS[@]}"
  # The old launcher with the library of its own ABI (.carry/hopper_b, built from the same era).
  cp .carry/old_scratch/triton_sparse_mla.py .carry/old_scratch/hopper_mla.py kernels/attention/ &&
    cp .carry/old_scratch/solution.py kernels/indexer/ && cp .carry/hopper_b/libhopper_mla.so build/sm90a/ &&
    step scratch-tests-old 120 python3 -m pytest -q -m gpu -p no:cacheprovider "${SCRATCH_TESTS[@]}"
elif [ "$MODE" = cluster ]; then
  step pytest-hopper 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py
  step bench-cluster 240 python3 $P/attention/bench_cluster.py "$P/attention/cluster"
  for tool in memcheck racecheck synccheck; do
    step "cluster-$tool" 100 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      python3 $P/attention/hopper_check.py 64-2048-2-bf16-2-scattered-cluster 128-2048-1-fp8-2-scattered-cluster \
      64-256-3-fp8-2-full-cluster 128-1024-2-bf16-2-empty-cluster
  done
elif [ "$MODE" = session9 ]; then
  step pytest-gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  sanitize_hopper session9
  step bench-builds 300 bash $P/attention/bench_builds.sh "$P/attention/session9/builds" \
    new=build/sm90a/libhopper_mla.so head=.carry/head/libhopper_mla.so,combine new2=build/sm90a/libhopper_mla.so
  bash "$0" scratch-tests "$OUT/scratch"
elif [ "$MODE" = fp16-range ]; then
  # FP8 values past fp16's range (session 10): the build against session 9's, A/B/A, each through the
  # Hopper GPU tests (the old build fails the new range tests), the sanitizers on the range tests, and
  # racecheck on a clustered FP8 case that reuses ring stages (8 blocks a CTA) with both builds.
  step bench-builds 330 bash $P/attention/bench_builds.sh "$P/attention/session10/fp16-range" \
    new=build/sm90a/libhopper_mla.so s9=.carry/s9final/libhopper_mla.so new2=build/sm90a/libhopper_mla.so
  for tool in memcheck synccheck racecheck; do
    step "range-$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 1 python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_attention_hopper.py -k "past_the_fp16 and (both or q-128)"
  done
  step reuse-racecheck-new 60 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 $P/attention/hopper_check.py 128-2048-2-fp8-4-scattered
  cp build/sm90a/libhopper_mla.so /tmp/libhopper_mla.new.so && cp .carry/s9final/libhopper_mla.so build/sm90a/
  step reuse-racecheck-s9 60 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 $P/attention/hopper_check.py 128-2048-2-fp8-4-scattered
  cp /tmp/libhopper_mla.new.so build/sm90a/libhopper_mla.so
elif [ "$MODE" = fp16-range-ab ]; then
  # What each part of the fp16-range handling costs: builds with one part taken out (.carry/cv10/, made
  # here by attention/session10/make_variants.py), against session 9's kernel (.carry/s9final: 2ec554a
  # built here) and the whole new one.
  V=.carry/cv10
  step bench-builds 420 bash $P/attention/bench_builds.sh "$P/attention/session10/fp16-range-ab" \
    s9=.carry/s9final/libhopper_mla.so new=build/sm90a/libhopper_mla.so none=$V/none/libhopper_mla.so \
    release_old=$V/release_old/libhopper_mla.so no_qcheck=$V/no_qcheck/libhopper_mla.so \
    no_prodcheck=$V/no_prodcheck/libhopper_mla.so no_conscheck=$V/no_conscheck/libhopper_mla.so
elif [ "$MODE" = session10 ]; then
  # Session 10's kernel (fp16's range on the FP8 path) against session 9's (.carry/s9final: 2ec554a built
  # here) and the one without the range handling (none: .carry/cv10/none, from
  # attention/session10/make_variants.py); then the whole GPU suite, the sanitizers and verify.
  step bench-builds 300 bash $P/attention/bench_builds.sh "$P/attention/session10/builds" \
    s9=.carry/s9final/libhopper_mla.so new=build/sm90a/libhopper_mla.so none=.carry/cv10/none/libhopper_mla.so \
    new2=build/sm90a/libhopper_mla.so
  step pytest-gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  for tool in memcheck synccheck racecheck; do
    step "range-$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 1 python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_attention_hopper.py -k "past_the_fp16 and (both or q-128)"
  done
  sanitize_hopper session10
  step reuse-racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 $P/attention/hopper_check.py 128-2048-2-fp8-4-scattered
  step verify-contest 120 $DSACTL verify --suite contest -d 'dsa_sparse_attention*' --trials 1 \
    --json "$P/attention/session10/verify-contest-attention.json"
  step verify-hopper 120 $DSACTL verify --suite all -d 'dsa_sparse_attention_h*' -s dsactl-attention-hopper \
    -s dsactl-attention-hopper-lsee -s dsactl-attention-hopper-fp8kv --trials 1 --json "$P/attention/session10/verify-hopper.json"
elif [ "$MODE" = q-path ]; then
  # Where the FP8 Q range check's small-T cost sits: the check alone, the rare path's code alone, neither
  # (.carry/cv10 from attention/session10/make_variants.py q_check_only q_rare_only no_qcheck).
  V=.carry/cv10
  step bench-builds 330 bash $P/attention/bench_builds.sh "$P/attention/q-path" new=build/sm90a/libhopper_mla.so \
    q_check_only=$V/q_check_only/libhopper_mla.so q_rare_only=$V/q_rare_only/libhopper_mla.so \
    no_qcheck=$V/no_qcheck/libhopper_mla.so new2=build/sm90a/libhopper_mla.so
elif [ "$MODE" = session11 ]; then
  # Prepared in session 11 (its one device call ran the first two steps on the same SASS; the rest needs CUPTI):
  # the shipped Hopper build through its tests and racecheck on the fp16-range tests; every timing method
  # on a Triton call; the Triton FP8 kernel with fp16 tiles (shipped in session 12, its experiment
  # removed with its steps); this build against session 10's (.carry/s10); the Hopper kernel's bf16 split
  # partials everywhere (shipped gated in session 13, its experiment removed with its step). Steps in order
  # of what a cut-off run can least afford to lose. The carried files come from attention/session11/prepare_carry.sh.
  S11=$P/attention/session11
  mkdir -p "$S11"
  step pytest-hopper 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py
  step range-racecheck 150 compute-sanitizer --tool racecheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_attention_hopper.py -k "past_the_fp16 and (both or q-128)"
  step timing-methods 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bench.py -k "every_available"
  step bench-builds 240 bash $P/attention/bench_builds.sh "$S11/builds" s10=.carry/s10/libhopper_mla.so \
    new=build/sm90a/libhopper_mla.so
elif [ "$MODE" = session12 ]; then
  # Session 12: the fp16-tile FP8 kernel shipped as the 64/128-head FP8 configuration (64-token tiles) and
  # the torch-profiler fix for torch < 2.12: every GPU test, the Triton sanitizers, Hopper vs Triton.
  step pytest-gpu 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  step triton-memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
    python3 $P/attention/sanitize_attention.py all
  step triton-racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 $P/attention/sanitize_attention.py fp8_variant contest
  step bench-hopper 150 python3 $P/attention/bench_hopper.py "$P/attention/session12/shipped"
elif [ "$MODE" = session13 ]; then
  # Session 13: the Hopper kernel's split partials in bf16 on grids over half the SMs. Two device calls:
  # SKIP the second's steps in the first (ab) and the first's in the second.
  step ab 480 bash $P/attention/session13/ab.sh "$P/attention/session13/ab"
  step pytest-gpu 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  sanitize_hopper session13
  step racecheck-repeat 200 env RUNS=2 bash $P/attention/session12/racecheck_empty_cluster.sh
  # Then the combine's launches for bf16 partials (second call: SKIP="ab pytest-gpu session13-memcheck
  # session13-racecheck session13-synccheck racecheck-repeat"): A/B/A (ab.sh's header), every GPU test,
  # memcheck and racecheck on a Hopper call with each bf16 launch then tried (16, 8, 4 and 2 splits; only
  # the 16-split one shipped, session13/README.md).
  step ab-combine 300 env PATCH=.carry/combine.patch PREV=.carry/same TITLE="the combine's launch for bf16 partials" \
    bash $P/attention/session13/ab.sh "$P/attention/session13/ab-combine"
  step pytest-gpu-combine 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  for tool in memcheck racecheck; do
    step "combine-$tool" 200 compute-sanitizer --tool "$tool" --error-exitcode 1 python3 $P/attention/hopper_check.py \
      64-2048-8-bf16-16-scattered 128-2048-8-bf16-8-scattered 128-2048-16-fp8-4-scattered 128-2048-32-fp8-2-scattered
  done
elif [ "$MODE" = hopper-dev ]; then
  step pytest-hopper 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py
  sanitize_hopper hopper-dev
  step bench-builds 200 bash $P/attention/bench_builds.sh "$P/attention/builds-dev" \
    new=build/sm90a/libhopper_mla.so previous=.carry/hopper_b/libhopper_mla.so new2=build/sm90a/libhopper_mla.so
elif [ "$MODE" = indexer-topk ]; then
  # The whole indexer and top-k on every suite with the session-4 top-k, the contest bench against
  # both baselines, and score + top-k end to end against the previous top-k (.carry/topk/libtopk_base.so).
  step verify-topk-indexer 200 $DSACTL verify --suite all -d 'dsa_topk_*' --trials 1 \
    --json "$P/verify-topk-indexer.json"
  step bench-contest-indexer 150 $DSACTL bench --suite contest -d 'dsa_topk_indexer*' --trials 1 --iters 10 \
    --csv "$P/bench-contest-indexer.csv" --plot "$P/plots-contest-indexer"
  step topk-in-e2e 60 python3 $P/indexer/topk_in_e2e.py --lib new=build/sm90a/libtopk.so \
    --lib base=.carry/topk/libtopk_base.so --csv "$P/indexer/topk_in_e2e.csv"
elif [ "$MODE" = followup ]; then
  step pytest-indexer-bench 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_indexer.py tests/test_bench.py
  step indexer-sweep 40 env PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
    python3 $P/indexer/bench_indexer.py sweep --iters 10 --out "$P/indexer"
  step verify-sanitize 100 $DSACTL verify --suite all --trials 1 --sanitize --json "$P/verify-sanitize.json" \
    -s dsactl-indexer -s dsactl-attention -s dsactl-topk \
    -w contest-indexer-070 -w contest-attention-001 -w scale-topk-r8-len32768-bf16
  step indexer-contest 80 env PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
    python3 $P/indexer/bench_indexer.py contest --iters 10 --out "$P/indexer"
else
  step bench-contest-attention 40 $DSACTL bench --suite contest -d 'dsa_sparse_attention*' --trials 2 --iters 20 \
    --csv "$P/bench-contest-attention.csv" --plot "$P/plots-contest-attention"
  step bench-contest-indexer 90 $DSACTL bench --suite contest -d 'dsa_topk_indexer*' --trials 1 --iters 10 \
    --csv "$P/bench-contest-indexer.csv" --plot "$P/plots-contest-indexer"
  step bench-scale-topk 50 $DSACTL bench --suite scale -d 'dsa_topk_page_transform*' --no-reference --trials 1 \
    --iters 10 --csv "$P/bench-scale-topk.csv" --plot "$P/plots-scale-topk"
  # Indexer scoring alone on the DeepGEMM shapes and score + top-k at 64/128 x 131072, against the
  # previous kernels (profiles/h200/indexer/run.sh prepare saves them in .carry/indexer_old).
  step indexer-old-vs-new 70 env PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
    python3 $P/indexer/bench_indexer.py sweep e2e --out "$P/indexer"
  step profile-contest 50 $DSACTL profile --ncu roofline --suite contest \
    -w contest-indexer-000 -w contest-indexer-100 -w contest-attention-001 -o "$P/ncu-contest"
  step profile-scale 60 $DSACTL profile --ncu roofline --suite scale -w scale-indexer-b128-ctx131072 \
    -w scale-topk-r128-len131072-bf16 -w scale-attention-h128-t128-bf16 -o "$P/ncu-scale"
fi
tar czf "$OUT/results-$MODE.tgz" "$P" build/sm90a/report.json 2>/dev/null
