#!/usr/bin/env bash
# Regenerates profiles/<gpu>/ (and the Nsight Compute fixtures under tests/fixtures/ncu/) on a GPU machine.
#
#   bash profiles/reproduce.sh                 # every area, in the order below
#   bash profiles/reproduce.sh contest attention   # some areas
#
# Run from the repository root. The checkout runs as is (`python3 -m dsactl`, no install needed) with the
# machine's torch and triton; `dsactl build --arch <arch>` must have been run (on this machine or on a CPU
# machine with the same nvcc, build/<arch>/ carried along). Areas:
#   env        environment.json: GPU, clocks, driver, torch, triton, nvcc, ncu (dsactl doctor)
#   verify     verify.json: every solution on every embedded suite against the references
#   contest    contest.csv/.json + PNGs: the contest suite, every solution against the reference
#   attention  attention.csv/.json + PNGs: production attention shapes (16-128 heads, 1-512 tokens, bf16 and
#              FP8 KV), with FlashMLA's sparse decode in the same run when it imports (below)
#   prefill    prefill.csv/.json + PNGs: attention at 64/128 heads x 1024-8192 tokens over a 64K-token context,
#              bf16 and FP8 KV, with FlashMLA's sparse prefill (bf16) and decode (FP8) kernels in the same run,
#              and its prefill on an FP8 cache upconverted to bf16 first (flashmla-upconvert), as engines run it
#   prefill-indexer prefill-indexer.csv/.json: the prefill indexer and its top-k (dsa_prefill_indexer_*) over
#              whole causal prompts of 4K and 16K tokens (the prefill suite's), chunked and fused, beside
#              DeepGEMM's logits under the chunked top-k (-b deepgemm, built from .baselines/DeepGEMM)
#   dispatch   dispatch.csv: attention at 16-128 heads x 1-128 tokens, bf16 and FP8 KV, the dispatch's choice
#              beside each kernel forced (-b dsactl-hopper, dsactl-mma, dsactl-triton): where the dispatch's token
#              thresholds (kernels/attention/dispatch.py) come from, and what tests/test_dispatch.py holds them to
#   conformance conformance.json: FlashMLA's and DeepGEMM's own tests against dsactl.compat.flash_mla and
#              dsactl.compat.deep_gemm (python -m dsactl.conformance), from checkouts in .baselines/FlashMLA and
#              .baselines/DeepGEMM (a checkout that is not there is skipped, saying so)
#   flashmla-cases flashmla-cases.csv: FlashMLA's own V3.2 performance cases (its tests' generator and calls),
#              timed with dsactl.compat.flash_mla and with FlashMLA built from .baselines/FlashMLA, same timer
#   deepgemm-cases deepgemm-cases.csv: every sm_90 FP8 case of DeepGEMM's test_mqa_logits and test_paged_mqa_logits
#              (its tests' inputs and calls), timed with dsactl.compat.deep_gemm and with DeepGEMM built from
#              .baselines/DeepGEMM, same timer, with each case's TFLOP/s and share of the FP8 matmul peak
#   indexer    indexer.csv/.json + PNGs: the indexer at batch 1-128 x context 4K-128K
#   topk       topk.csv/.json + PNGs: top-k with page translation, rows 1-128 x lengths 2K-128K
#   pipeline   pipeline.csv/.json + pipeline/stages.png: the whole decode step (DecodeStep), batch 1-128 x
#              context 4K-128K x 16/128 heads x next_n 1-2, CUDA-graph replay against its kernels and PyTorch
#   executor   executor.csv: what --gpus 0 and --ray add to the scale verify sweep on one GPU (python -m
#              dsactl.executor.overhead): a warm-up, then plain, --gpus and --ray (a local cluster, where ray imports)
#              in turns, twice, each run's wall time and its pairs' own seconds (13-18 minutes on an H100;
#              the CSV is rewritten after each run, so a run cut short keeps what it finished)
#   tune       tune-contest.json, tune-scale.json: `dsactl tune --dry-run` of the attention kernels on the
#              contest and scale suites, every candidate verified then timed against the hand-picked choice
#              (the gain per shape bucket; about 6 minutes on an H100); the tuned tables beside the kernels
#              stay as they are
#   ncu        Nsight Compute reports (section set warps) of one workload per kernel family, kept as the CPU tests' fixtures
#              (tests/fixtures/ncu/<family>.ncu-rep), then ncu-tables
#   ncu-tables ncu/<family>/: the reports' tables, roofline and utilisation charts (dsactl profile --import;
#              needs no GPU, so it also runs where the GPU machine's ncu-report cannot read them)
#   ncu-flashmla  ncu/attention-vs-flashmla/: Nsight Compute (warps: stall reasons too) on our decode and
#              FlashMLA's on the same 64/128-head workloads (T=128, 256), FP8 and bf16 KV, in one run
#   readme     README.md's result tables rewritten from the CSVs above (python3 -m dsactl.results)
#
# FlashMLA (the `-b flashmla` baseline) is built from source when .baselines/FlashMLA holds its repository
# and .baselines/nvidia_cutlass-*.whl the CUTLASS headers (docs/design.md, "Baselines"); without them the
# attention area times our kernels alone and says so. DeepGEMM is built the same way from .baselines/DeepGEMM,
# which also holds fmt's headers in third-party/fmt/include.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
DSACTL=(python3 -m dsactl)
# The folder is named for this machine's GPU; GPU=h200 names it on a machine without one (area ncu-tables).
GPU=${GPU:-$(python3 -c "import torch; from dsactl.device import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))")} ||
  { echo "reproduce.sh: no CUDA GPU is visible (set GPU=<name> for the areas that need none)" >&2; exit 2; }
DIR=profiles/$GPU
mkdir -p "$DIR"
AREAS=("$@")
[ ${#AREAS[@]} -eq 0 ] && AREAS=(env verify conformance flashmla-cases deepgemm-cases contest attention prefill prefill-indexer dispatch indexer topk pipeline executor tune ncu ncu-flashmla readme)

# cupti-python times kernels by CUPTI; its wheel and pyelftools' (which it imports), carried in .carry/,
# install where pip has no network.
if ! python3 -c "from cupti import cupti" 2>/dev/null && ls .carry/cupti_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/cupti .carry/*.whl &&
    export PYTHONPATH=/tmp/cupti:$PYTHONPATH
fi

flashmla() {  # puts FlashMLA on the path, building it first when its source is here and it does not import
  if ! python3 -c "import flash_mla" 2>/dev/null && [ -d .baselines/FlashMLA ]; then
    ( cd .baselines/FlashMLA && rm -rf csrc/cutlass &&
      python3 -c "import zipfile, glob; z = zipfile.ZipFile(glob.glob('../nvidia_cutlass-*.whl')[0]); \
z.extractall('/tmp/cutlass-wheel', [n for n in z.namelist() if n.startswith('cutlass_library/source/')])" &&
      mv /tmp/cutlass-wheel/cutlass_library/source csrc/cutlass &&
      CPLUS_INCLUDE_PATH=$(dirname "$(which nvcc)")/../include/cccl FLASH_MLA_DISABLE_SM100=1 \
        MAX_JOBS=$(nproc) NVCC_THREADS=2 python3 setup.py build_ext --inplace >/tmp/flashmla-build.log 2>&1 ) ||
      echo "reproduce.sh: FlashMLA did not build (/tmp/flashmla-build.log)" >&2
    export PYTHONPATH=$PWD/.baselines/FlashMLA:$PYTHONPATH
  fi
}

deepgemm() {  # builds DeepGEMM's extension in place (deep_gemm/_C*.so) once, when its source is here
  local dg=.baselines/DeepGEMM
  if [ -d $dg/deep_gemm ] && ! ls $dg/deep_gemm/_C*.so >/dev/null 2>&1; then
    # The JIT compiles kernels at run time against deep_gemm/include, where DeepGEMM's develop.sh links CUTLASS.
    ( cd $dg && rm -rf third-party/cutlass/include /tmp/deepgemm-cutlass &&
      python3 -c "import zipfile, glob; z = zipfile.ZipFile(glob.glob('../nvidia_cutlass-*.whl')[0]); \
z.extractall('/tmp/deepgemm-cutlass', [n for n in z.namelist() if n.startswith('cutlass_library/source/include/')])" &&
      mkdir -p third-party/cutlass && mv /tmp/deepgemm-cutlass/cutlass_library/source/include third-party/cutlass/ &&
      ln -sfn ../../third-party/cutlass/include/cutlass deep_gemm/include/cutlass &&
      ln -sfn ../../third-party/cutlass/include/cute deep_gemm/include/cute &&
      python3 setup.py build_ext --inplace >/tmp/deepgemm-build.log 2>&1 ) ||
      echo "reproduce.sh: DeepGEMM did not build (/tmp/deepgemm-build.log)" >&2
  fi
}

bench() {  # bench AREA ARGS...: one CSV/JSON and its PNGs per area
  local area=$1; shift
  "${DSACTL[@]}" bench "$@" --csv "$DIR/$area.csv" --json "$DIR/$area.json" --plot "$DIR/$area"
}

for area in "${AREAS[@]}"; do
  echo "== $area"
  case $area in
    env) "${DSACTL[@]}" doctor --json "$DIR/environment.json" ;;
    verify) "${DSACTL[@]}" verify --suite all --json "$DIR/verify.json" ;;
    contest) bench contest --suite contest -b reference --iters 20 --trials 1 ;;
    attention)
      # FlashMLA serves 64/128 heads; at 16/32 heads it runs padded to 64, as serving engines do, and so
      # does our own 64-head path (dsactl-padded64), beside the native kernels.
      flashmla
      baseline=(-b dsactl-padded64); python3 -c "import flash_mla" 2>/dev/null && baseline+=(-b flashmla) ||
        echo "reproduce.sh: FlashMLA does not import: attention is timed without it" >&2
      bench attention --suite scale -d 'dsa_sparse_attention_*' -s dsactl-attention -s dsactl-attention-fp8kv \
        --no-reference --iters 20 --trials 2 "${baseline[@]}" ;;
    prefill)
      flashmla
      baseline=(); python3 -c "import flash_mla" 2>/dev/null && baseline+=(-b flashmla -b flashmla-upconvert) ||
        echo "reproduce.sh: FlashMLA does not import: prefill is timed without it" >&2
      bench prefill --suite prefill -d 'dsa_sparse_attention_*' -s dsactl-attention -s dsactl-attention-fp8kv \
        --no-reference --iters 10 --trials 2 "${baseline[@]}" ;;
    prefill-indexer)
      deepgemm
      # DeepGEMM on this area's path only (the conformance runs resolve deep_gemm themselves). bench skips it,
      # saying why, where it does not import or its first call fails in a child process (dsactl.probe).
      PYTHONPATH=$PWD/.baselines/DeepGEMM:${PYTHONPATH:-} "${DSACTL[@]}" bench --suite prefill \
        -d 'dsa_prefill_indexer_*' --no-reference --iters 5 --trials 2 -b deepgemm \
        --csv "$DIR/prefill-indexer.csv" --json "$DIR/prefill-indexer.json" ;;
    dispatch) "${DSACTL[@]}" bench --suite dispatch -d 'dsa_sparse_attention_*' -s dsactl-attention \
        -s dsactl-attention-fp8kv --no-reference --iters 20 --trials 2 -b dsactl-hopper -b dsactl-mma -b dsactl-triton \
        --csv "$DIR/dispatch.csv" ;;
    conformance)
      for peer in FlashMLA:flash_mla DeepGEMM:deep_gemm; do
        IFS=: read -r checkout runner <<<"$peer"
        if [ -d ".baselines/$checkout/tests" ]; then
          python3 -m dsactl.conformance $runner --checkout ".baselines/$checkout" --json "$DIR/conformance.json"
        else
          echo "reproduce.sh: .baselines/$checkout is not here: its conformance run is skipped" >&2
        fi
      done ;;
    flashmla-cases)
      flashmla
      python3 -m dsactl.conformance flash_mla --checkout .baselines/FlashMLA --time "$DIR/flashmla-cases.csv" ;;
    deepgemm-cases)
      deepgemm
      python3 -m dsactl.conformance deep_gemm --checkout .baselines/DeepGEMM --time "$DIR/deepgemm-cases.csv" ;;
    indexer) bench indexer --suite scale -d 'dsa_topk_indexer_*' --no-reference --iters 20 --trials 2 ;;
    topk) bench topk --suite scale -d 'dsa_topk_page_transform_*' --no-reference --iters 20 --trials 2 ;;
    pipeline) "${DSACTL[@]}" bench --pipeline --iters 20 --warmup 5 --csv "$DIR/pipeline.csv" --json "$DIR/pipeline.json" --plot "$DIR/pipeline" ;;
    executor)
      modes=plain,gpus
      python3 -c "import ray" 2>/dev/null && modes+=,ray || echo "reproduce.sh: ray does not import: no --ray runs" >&2
      python3 -m dsactl.executor.overhead --suite scale --rounds 2 --modes $modes --csv "$DIR/executor.csv" ;;
    tune)
      for suite in contest scale; do
        "${DSACTL[@]}" tune -d 'dsa_sparse_attention_*' --suite $suite --trials 2 --iters 30 --verify-trials 2 \
          --dry-run --json "$DIR/tune-$suite.json" || echo "reproduce.sh: tune on $suite failed" >&2
      done ;;
    ncu)
      mkdir -p tests/fixtures/ncu
      for pick in indexer:dsactl-indexer:contest-indexer-100 topk:dsactl-topk:scale-topk-r8-len32768-fp32 \
                  attention:dsactl-attention:contest-attention-004; do
        IFS=: read -r family solution workload <<<"$pick"
        "${DSACTL[@]}" profile --ncu warps --suite all --solution "$solution" -w "$workload" -o "/tmp/ncu-$family"
        mv "/tmp/ncu-$family/$solution.ncu-rep" "tests/fixtures/ncu/$family.ncu-rep" || echo "reproduce.sh: no $family report" >&2
      done
      "$0" ncu-tables ;;
    ncu-tables)
      for report in tests/fixtures/ncu/*.ncu-rep; do
        "${DSACTL[@]}" profile --import "$report" -o "$DIR/ncu/$(basename "$report" .ncu-rep)" || echo "reproduce.sh: cannot read $report" >&2
      done ;;
    ncu-flashmla)
      flashmla
      rm -rf /tmp/ncu-vs-flashmla
      # Reading the reports can crash where only ncu's own ncu_report is at hand; they stay in
      # /tmp/ncu-vs-flashmla, and the import line below runs anywhere `pip install ncu-report` works.
      for solution in dsactl-attention-fp8kv dsactl-attention; do  # FP8 KV, then bf16 (FlashMLA: sparse prefill)
        kv=$([ $solution = dsactl-attention ] && echo bf16 || echo fp8)
        "${DSACTL[@]}" profile --ncu warps --suite scale --solution $solution -b flashmla \
          -w scale-attention-h64-t128-$kv -w scale-attention-h128-t128-$kv \
          -w scale-attention-h64-t256-$kv -w scale-attention-h128-t256-$kv -o /tmp/ncu-vs-flashmla/$kv
      done
      ls /tmp/ncu-vs-flashmla/*/*.ncu-rep >/dev/null &&
        "${DSACTL[@]}" profile $(printf -- '--import %s ' /tmp/ncu-vs-flashmla/*/*.ncu-rep) \
          -o "$DIR/ncu/attention-vs-flashmla" ;;
    readme) python3 -m dsactl.results --write README.md ;;
    *) echo "reproduce.sh: unknown area $area" >&2; exit 2 ;;
  esac || echo "reproduce.sh: area $area failed" >&2
done
