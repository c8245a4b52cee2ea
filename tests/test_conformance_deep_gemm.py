"""The runner of DeepGEMM's own indexer tests against dsactl.compat.deep_gemm (dsactl/conformance/deep_gemm.py):
its `deep_gemm` module, case selection and outcomes on a small fake checkout built here, and on DeepGEMM's real
checkout at .baselines/DeepGEMM where one is (CI has none: those tests skip). Running DeepGEMM's cases needs CUDA."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_checkout import write_checkout

from dsactl.compat import deep_gemm as drop_in
from dsactl.conformance import deep_gemm as runner
from dsactl.conformance import report
from dsactl.conformance.report import ERROR, FAILED, NOT_SERVED, PASSED

CHECKOUT = Path(__file__).resolve().parents[1] / ".baselines" / "DeepGEMM"
needs_checkout = pytest.mark.skipif(not (CHECKOUT / runner.TEST_FILE).is_file(),
                                    reason=f"no DeepGEMM checkout at {CHECKOUT}")

# A checkout with DeepGEMM's layout: helpers importing from the extension, generators.py, and a test file whose
# enumeration branches on the arch and whose cases pass, fail, hit the drop-in's refusal, raise, or call _C.
FAKE = {
    "deep_gemm/testing/__init__.py": "from . import utils\nfrom .utils import *\n",
    "deep_gemm/testing/utils.py": """
        import torch

        def get_arch_major() -> int:
            return torch.cuda.get_device_capability()[0]
    """,
    "deep_gemm/utils/__init__.py": """
        from .._C import set_mk_alignment_for_contiguous_layout

        def ceil_div(x: int, y: int) -> int:
            return (x + y - 1) // y
    """,
    "tests/generators.py": """
        from deep_gemm.testing import get_arch_major
        from deep_gemm.utils import ceil_div, set_mk_alignment_for_contiguous_layout
    """,
    "tests/test_attention.py": """
        import os
        import random

        import torch

        import deep_gemm
        from deep_gemm.testing import get_arch_major
        from generators import get_arch_major, set_mk_alignment_for_contiguous_layout

        DRAWS = []

        def sample_mqa_cases(name, cases):
            return cases

        def test_mqa_logits():
            def enumerate_cases():
                for is_fp4 in ((True, False) if get_arch_major() == 10 else (False, )):
                    for what in ('pass', 'fail', 'refused', 'raise', 'extension'):
                        yield is_fp4, what

            print('Testing FP8 MQA Logits:')
            for is_fp4, what in sample_mqa_cases('prefill', list(enumerate_cases())):
                DRAWS.append((random.random(), torch.rand(1).item(), os.environ.get('DG_USE_NVIDIA_TOOLS')))
                if what == 'fail':
                    assert deep_gemm.utils.ceil_div(5, 2) == 2
                if what == 'refused':
                    deep_gemm.fp8_fp4_mqa_logits((torch.zeros(1), torch.zeros(1)), None, None, None, None)
                if what == 'raise':
                    raise ValueError('boom\\nsecond line')
                if what == 'extension':
                    set_mk_alignment_for_contiguous_layout(128)
                print(' > perf figures')
    """,
}
FAIL_LINE = "assert deep_gemm.utils.ceil_div(5, 2) == 2"
SM100_FP4 = "DeepGEMM runs it on sm_100 only (is_fp4=True)"


@pytest.fixture
def fake(tmp_path):
    return write_checkout(tmp_path, FAKE)


def test_deep_gemm_resolves_to_the_drop_in_with_the_checkouts_helpers_and_is_put_back(fake):
    os.environ.pop("DG_USE_NVIDIA_TOOLS", None)
    with runner.deep_gemm_tests(fake) as tests:
        import deep_gemm
        assert tests.deep_gemm is deep_gemm
        for name in ("fp8_mqa_logits", "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata",
                     "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_num_sms", "set_num_sms"):
            assert getattr(deep_gemm, name) is getattr(drop_in, name), name
        assert Path(deep_gemm.testing.__file__).is_relative_to(fake)
        assert deep_gemm.utils.ceil_div(5, 2) == 3
        assert os.environ["DG_USE_NVIDIA_TOOLS"] == "1"
        with pytest.raises(NotImplementedError, match="compiled extension"):
            deep_gemm.utils.set_mk_alignment_for_contiguous_layout(128)
    assert "deep_gemm" not in sys.modules and "generators" not in sys.modules
    assert "DG_USE_NVIDIA_TOOLS" not in os.environ


def test_each_sm90_case_runs_alone_with_its_own_outcome_and_sm100_cases_are_not_served(fake):
    with runner.deep_gemm_tests(fake) as tests:
        report = runner.run_suite(tests, "fake.mqa_logits", "test_mqa_logits", "abc123")
        draws = tests.DRAWS
    outcomes = {c.name: (c.outcome, c.reason) for c in report.cases}
    assert list(outcomes)[:5] == [f"is_fp4=False, what={w}" for w in ("pass", "fail", "refused", "raise", "extension")]
    assert outcomes["is_fp4=False, what=pass"] == (PASSED, "")
    outcome, reason = outcomes["is_fp4=False, what=fail"]
    assert outcome == FAILED and reason.startswith("test_attention.py:") and reason.endswith(FAIL_LINE)
    outcome, reason = outcomes["is_fp4=False, what=refused"]
    assert outcome == NOT_SERVED and "FP4 q" in reason
    assert outcomes["is_fp4=False, what=raise"] == (ERROR, "ValueError: boom")
    outcome, reason = outcomes["is_fp4=False, what=extension"]
    assert outcome == ERROR and reason.startswith("NotImplementedError: deep_gemm._C.set_mk_alignment")
    sm100 = {name: o for name, o in outcomes.items() if name.startswith("is_fp4=True")}
    assert len(sm100) == 5 and set(sm100.values()) == {(NOT_SERVED, SM100_FP4)}
    # One call a case, each from the same seed, under DeepGEMM's profiling switch.
    assert len(draws) == 5 and len(set(draws)) == 1 and draws[0][2] == "1"
    refused = outcomes["is_fp4=False, what=refused"][1]
    assert report.summary() == {"suite": "fake.mqa_logits", "source": "abc123", "passed": 1, "total": 4,
                                "failed": 1, "errors": 2, "not_served": {refused: 1, SM100_FP4: 5}}


def test_a_test_without_the_case_hook_is_refused(fake):
    with runner.deep_gemm_tests(fake) as tests:
        with pytest.raises(RuntimeError, match="no `for"):
            runner.case_fields(tests, "sample_mqa_cases")


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_the_source_is_the_checkouts_own_commit_never_an_enclosing_repositorys(fake):
    assert report.checkout_commit(fake) == report.UNKNOWN
    (fake / "COMMIT").write_text("54e22612409371d6364144b69086735beb54e98b\n")
    assert report.checkout_commit(fake) == "54e22612409371d6364144b69086735beb54e98b"
    _git(fake, "init", "-q")
    _git(fake, "add", "-A")
    _git(fake, "commit", "-q", "-m", "fake")
    head = _git(fake, "rev-parse", "HEAD")
    assert report.checkout_commit(fake) == head
    inner = fake / "vendored"  # a folder inside another repository: its COMMIT file, not that repository's HEAD
    inner.mkdir()
    (inner / "COMMIT").write_text("feed\n")
    assert report.checkout_commit(inner) == "feed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_run_refuses_without_a_gpu_rather_than_failing_every_case(fake):
    with pytest.raises(RuntimeError, match="GPU"):
        runner.run(fake)


@needs_checkout
def test_the_checkouts_own_helpers_load_and_compute():
    with runner.deep_gemm_tests(CHECKOUT) as tests:
        import deep_gemm
        assert tests.deep_gemm.fp8_fp4_paged_mqa_logits is drop_in.fp8_fp4_paged_mqa_logits
        kv = torch.randn(16, 32)
        fp8, scale = deep_gemm.utils.per_custom_dims_cast_to_fp8(kv, (0, ), False)
        assert fp8.dtype == torch.float8_e4m3fn and scale.shape == (16, )
        assert deep_gemm.testing.calc_diff(fp8.float() * scale[:, None], kv) < 1e-3
        assert deep_gemm.testing.bench_kineto(lambda: None, ("mqa_logits", "clean_logits")) == (1, 1)
    assert report.checkout_commit(CHECKOUT) != report.UNKNOWN


@needs_checkout
def test_deep_gemms_own_enumeration_gives_the_sm90_fp8_cases_to_run_and_lists_the_rest():
    with runner.deep_gemm_tests(CHECKOUT) as tests:
        prefill, paged = (runner.plan(tests, name) for name in runner.SUITES.values())
        every = {name: set(runner.listed_cases(tests, name, 9)) | set(runner.listed_cases(tests, name, 10))
                 for name in runner.SUITES.values()}

    # Prefill on sm_90: 2 logits dtypes x (full cleaned, compressed) x 2 x 2 lengths x 2 heads x 3 dims x CP on/off.
    cases = [dict(zip(prefill.fields, c)) for c in prefill.served]
    assert len(cases) == 2 * 2 * 2 * 2 * 2 * 3 * 2
    assert all(not c["is_fp4"] and c["weights_dtype"] == torch.float32 and c["num_heads"] in (32, 64) for c in cases)
    # Paged on sm_90: 2 logits dtypes x 3 (batch, context) pairs x next_n 1, 2 x 2 heads, 64-token blocks, dim 128.
    cases = [dict(zip(paged.fields, c)) for c in paged.served]
    assert len(cases) == 2 * 3 * 2 * 2
    assert all(not c["is_varlen"] and not c["is_fp4"] and c["block_kv"] == 64 and c["head_dim"] == 128 for c in cases)

    for p, name in ((prefill, "test_mqa_logits"), (paged, "test_paged_mqa_logits")):
        listed = [c for c, _ in p.not_served]
        assert set(p.served) | set(listed) == every[name] and not set(p.served) & set(listed)
        assert len(listed) == len(set(listed)) and len(p.served) == len(set(p.served))
        fp4 = p.fields.index("is_fp4")
        assert all(not c[fp4] for c in p.served) and any(c[fp4] for c in listed)
        assert all(reason.startswith("DeepGEMM runs it on sm_100 only (") for _, reason in p.not_served)
    assert prefill.name(prefill.served[0]).startswith("is_fp4=False, logits_dtype=bfloat16, weights_dtype=float32")


@pytest.mark.gpu
@needs_checkout
@pytest.mark.parametrize("test_name", runner.SUITES.values())
def test_deep_gemms_first_sm90_case_passes_on_the_drop_in(test_name):
    with runner.deep_gemm_tests(CHECKOUT) as tests:
        case = runner.plan(tests, test_name).served[0]
        assert runner.run_case(tests, test_name, case) == (PASSED, "")
