"""Builds the session-10 ablation variants of the Hopper kernel into .carry/cv10/NAME/libhopper_mla.so
(used by `run.sh fp16-range-ab` and `run.sh session10`): the shipped kernel with one part of its
fp16-range handling taken out by a text substitution each, compiled as `dsactl build` compiles it.

    python profiles/h200/attention/session10/make_variants.py [NAME ...]   # repository root, needs nvcc
                                                                          # (no NAME: every variant)

release_old: one lane a warp arrives on both empty barriers (session 9's release); no_qcheck: no Q range
check; no_prodcheck: no producer vote (tokens never shifted); no_conscheck: no consumer vote (columns
never scaled back); none: all four; q_check_only, q_rare_only: below. All fail the range tests they
need; they exist to be timed. They apply to the kernel as of session 11 (a substitution that no longer
matches stops the script with the line it looked for).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SOURCE = Path("kernels/attention/hopper_mla.cu")
OUT = Path(".carry/cv10")
NVCC = ["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-O3", "-lineinfo", "-Xptxas", "-v,-warn-spills",
        "--shared", "-Xcompiler", "-fPIC"]

RELEASE_OLD = [
    ("""  mbar_arrive(sm.empty(stage));
  if constexpr (kPeers > 1) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive_cluster(sm.empty(stage) + peer_delta);
  }""", """  if constexpr (kPeers > 1) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
      mbar_arrive(sm.empty(stage));
      mbar_arrive_cluster(sm.empty(stage) + peer_delta);
    }
  } else {
    mbar_arrive(sm.empty(stage));
  }"""),
    ("mbar_init(sm.empty(s), kConsumerThreads + (kPeers - 1) * kConsumerThreads / 32);",
     "mbar_init(sm.empty(s), kPeers > 1 ? kConsumerThreads / 32 * kPeers : kConsumerThreads);"),
]
NO_QCHECK = [
    ("  if (largest >= (kBf16Pow16 << 16)) atomicOr(sm.q_over(), 1);\n"
     "  named_barrier_sync(kBarQReady, kConsumerThreads);\n  if (!*sm.q_over()) return false;",
     "  named_barrier_sync(kBarQReady, kConsumerThreads);\n  if (largest != 12345u) return false;"),
    ("    largest = max(largest, bf16x8_absmax_bits(raw[k]));\n", ""),
]
NO_PRODCHECK = [
    ("""  const float largest = slice_largest(s);
  if (__any_sync(0xFFFFFFFF, largest >= kFp16Max)) {
    store_fp8_shifted(sm, stage, token, s, token_shift(largest));
  } else {
    store_fp8_shifted(sm, stage, token, s, 0);
  }""", "  store_fp8_shifted(sm, stage, token, s, 0);"),
]
NO_CONSCHECK = [
    ("      shifted_columns = __any_sync(0xFFFFFFFF, largest > column_code(0));",
     "      shifted_columns = largest == 12345;"),
]
# Where the Q check's small-T cost sits (for the next session): the check and its flag without the rare
# path's code; the rare path's code (never taken) without the check. (A third, the rows' maxima cleared in
# the prologue so that the rare path has one barrier fewer, passed racecheck in session 11 and shipped.)
# The Q rare path, from the flag's test to the function's end (read from the source rather than copied).
RARE_PATH = re.search(r"  if \(!\*sm\.q_over\(\)\) return false;\n.*?  return true;\n}\n", SOURCE.read_text(), re.S).group(0)
Q_CHECK_ONLY = [(RARE_PATH, "  return *sm.q_over() != 0;\n}\n")]
Q_RARE_ONLY = NO_QCHECK[1:] + [
    ("  if (largest >= (kBf16Pow16 << 16)) atomicOr(sm.q_over(), 1);\n"
     "  named_barrier_sync(kBarQReady, kConsumerThreads);\n  if (!*sm.q_over()) return false;",
     "  named_barrier_sync(kBarQReady, kConsumerThreads);\n  if (p.topk > 0) return false;"),
]
VARIANTS = {
    "release_old": RELEASE_OLD,
    "no_qcheck": NO_QCHECK,
    "no_prodcheck": NO_PRODCHECK,
    "no_conscheck": NO_CONSCHECK,
    "none": RELEASE_OLD + NO_QCHECK + NO_PRODCHECK + NO_CONSCHECK,
    "q_check_only": Q_CHECK_ONLY,
    "q_rare_only": Q_RARE_ONLY,
}


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        print(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
        return 2
    source = SOURCE.read_text()
    for name in names or VARIANTS:
        substitutions = VARIANTS[name]
        text = source
        for old, new in substitutions:
            if text.count(old) != 1:
                print(f"{name}: the kernel no longer has exactly one {old.splitlines()[0].strip()!r}")
                return 1
            text = text.replace(old, new)
        variant = SOURCE.with_name(f"_variant_{name}.cu")  # beside the source, for its #include
        variant.write_text(text)
        (OUT / name).mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(NVCC + ["-o", str(OUT / name / "libhopper_mla.so"), str(variant)],
                                  capture_output=True, text=True)
        finally:
            variant.unlink()
        spills = re.findall(r"(\d+) bytes spill stores", done.stderr)
        print(f"{name}: nvcc rc {done.returncode}, spill stores {spills}")
        if done.returncode != 0:
            print(done.stderr[-2000:])
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
