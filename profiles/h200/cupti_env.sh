# Sourced (from the repository root) by the H200 scripts: the carried cupti-python wheel
# (.carry/cupti_python-*.whl) installed to /tmp/cupti and put on PYTHONPATH, so that bench times by
# CUPTI; without the wheel bench takes its next timing method.
if ls .carry/cupti_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/cupti .carry/cupti_python-*.whl >/dev/null 2>&1 &&
    export PYTHONPATH=/tmp/cupti${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "from cupti import cupti" 2>/dev/null ||
  echo "cupti_env.sh: cupti-python does not import here; bench falls back to its next timing method" >&2
