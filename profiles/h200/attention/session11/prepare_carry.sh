#!/usr/bin/env bash
# Builds, on the CPU machine (nvcc 13.0, this checkout's venv active), everything that
# `bash profiles/h200/run.sh session11 OUT` needs beside the tree, so that one device call runs it all;
# then carry ["build/sm90a", ".carry"]. From the repository root:
#   bash profiles/h200/attention/session11/prepare_carry.sh
# .carry/ is kept out of git (.git/info/exclude) and does not survive a session: run this in each one.
#   .carry/cupti_python-13.0.1-*.whl   CUPTI timing on the H200 (the image has no cupti-python; 13.4.0 gave
#                                      no CUPTI there in session 11)
#   .carry/s10/libhopper_mla.so        session 10's kernel (0cccdce), the baseline of the builds bench
#   build/sm90a                        this tree's build
set -euo pipefail
[ -f pyproject.toml ] && [ -d .git ] || { echo "run from the repository root"; exit 2; }
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
git diff --quiet -- kernels || { echo "kernels/ has uncommitted changes: the builds need a clean tree"; exit 2; }
mkdir -p .carry/s10
ls .carry/cupti_python-13.0.1-*.whl >/dev/null 2>&1 ||
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .carry cupti-python==13.0.1

# Session 10's kernel, built in a worktree of its commit.
S10=$(mktemp -d)
git worktree add -q --detach "$S10" 0cccdce
(cd "$S10" && python -m dsactl build --arch sm90a >/dev/null)
cp "$S10/build/sm90a/libhopper_mla.so" .carry/s10/
git worktree remove --force "$S10"

python -m dsactl build --arch sm90a >/dev/null
du -sh .carry build/sm90a
