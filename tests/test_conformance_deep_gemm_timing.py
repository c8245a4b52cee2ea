"""DeepGEMM's own indexer cases timed beside dsactl's drop-in (dsactl/conformance/deep_gemm_timing.py,
`python -m dsactl.conformance deep_gemm --time`): on a small fake checkout whose tests call their kernels as
DeepGEMM's do, with a fake DeepGEMM and a fake timer; dsactl's calls run its kernels (the Triton interpreter
here). The real cases need DeepGEMM built on a GPU (profiles/reproduce.sh deepgemm-cases)."""

import csv
import sys
from types import ModuleType

import pytest
import torch
from fake_checkout import write_checkout

from dsactl.compat import deep_gemm as drop_in
from dsactl.conformance import deep_gemm_timing as timing
from dsactl.conformance.__main__ import main
from dsactl.conformance.report import FAILED, NOT_SERVED

# A checkout with DeepGEMM's layout whose tests build inputs, check a first call, count FLOPs and time the call
# through bench_kineto as DeepGEMM's test_attention.py does; each has sm_100-only cases (FP4) that are not timed.
FAKE = {
    "deep_gemm/testing/__init__.py": """
        import os

        import torch

        def get_arch_major() -> int:
            return torch.cuda.get_device_capability()[0]

        def bench_kineto(fn, kernel_names, num_tests=30):
            if int(os.environ.get('DG_USE_NVIDIA_TOOLS', 0)):
                return (1, ) * len(kernel_names)
            raise RuntimeError('profiles DeepGEMM kernels by name')
    """,
    "deep_gemm/utils/__init__.py": """
        def ceil_div(x: int, y: int) -> int:
            return (x + y - 1) // y
    """,
    "tests/generators.py": "from deep_gemm.testing import get_arch_major\n",
    "tests/test_attention.py": """
        import torch

        import deep_gemm
        from deep_gemm.testing import bench_kineto
        from generators import get_arch_major

        def sample_mqa_cases(name, cases):
            return cases

        def test_mqa_logits():
            def enumerate_cases():
                for is_fp4 in ((True, False) if get_arch_major() == 10 else (False, )):
                    for seq_len, what in ((2, 'timed'), (4, 'fails'), (4, 'timed'), (2, 'not timed')):
                        yield is_fp4, seq_len, what

            for is_fp4, seq_len, what in sample_mqa_cases('prefill', list(enumerate_cases())):
                num_heads, head_dim, seq_len_kv = 32, 32, 64
                q = torch.randn(seq_len, num_heads, head_dim).to(torch.float8_e4m3fn)
                kv = (torch.randn(seq_len_kv, head_dim).to(torch.float8_e4m3fn), torch.rand(seq_len_kv) + 0.5)
                weights = torch.randn(seq_len, num_heads)
                ks = torch.zeros(seq_len, dtype=torch.int)
                ke = torch.arange(seq_len, dtype=torch.int) + (seq_len_kv - seq_len)
                kernel_kwargs = dict(q=(q, None), kv=kv, weights=weights, cu_seq_len_k_start=ks,
                                     cu_seq_len_k_end=ke, clean_logits=True)
                logits = deep_gemm.fp8_fp4_mqa_logits(**kernel_kwargs)
                assert what != 'fails', f'Diff: {logits}'
                if what == 'not timed':
                    continue
                ref_cost = (ke - ks).sum()
                tflops = 2 * ref_cost * num_heads * head_dim / 1e12
                t, clean_t = bench_kineto(lambda: deep_gemm.fp8_fp4_mqa_logits(**kernel_kwargs),
                                          ('mqa_logits', 'clean_logits'))
                print(f'{tflops / t:4.0f} TFLOPS')

        def test_paged_mqa_logits():
            def enumerate_cases():
                for is_fp4 in ((True, False) if get_arch_major() == 10 else (False, )):
                    for num_heads in (32, 64):
                        yield is_fp4, num_heads

            for is_fp4, num_heads in sample_mqa_cases('paged', list(enumerate_cases())):
                batch_size, next_n, head_dim, block_kv = 2, 1, 128, 64
                context_lens = torch.tensor([40, 64], dtype=torch.int)
                q = torch.randn(batch_size, next_n, num_heads, head_dim).to(torch.float8_e4m3fn)
                kv = torch.zeros(batch_size, block_kv * (head_dim + 4), dtype=torch.uint8)
                kv[:, :block_kv * head_dim] = torch.randn(batch_size, block_kv * head_dim).to(
                    torch.float8_e4m3fn).view(torch.uint8)
                kv[:, block_kv * head_dim:] = torch.ones(batch_size, block_kv).view(torch.uint8)
                weights = torch.randn(batch_size * next_n, num_heads)
                block_table = torch.tensor([[1], [0]], dtype=torch.int)
                kernel_kwargs = dict(
                    q=(q, None), kv_cache=kv.view(batch_size, block_kv, 1, head_dim + 4), weights=weights,
                    context_lens=context_lens.view(-1, 1), block_table=block_table,
                    schedule_meta=deep_gemm.get_paged_mqa_logits_metadata(context_lens.view(-1, 1), block_kv,
                                                                          deep_gemm.get_num_sms()),
                    max_context_len=block_kv)
                deep_gemm.fp8_fp4_paged_mqa_logits(**kernel_kwargs)
                sum_lens = context_lens.sum().item()
                tflops_calc = 2 * sum_lens * next_n * num_heads * head_dim / 1e12
                t, clean_t = bench_kineto(lambda: deep_gemm.fp8_fp4_paged_mqa_logits(**kernel_kwargs),
                                          ('paged_mqa_logits', 'clean_logits'))
                print(f'{tflops_calc / t:4.0f} TFLOPS')
    """,
}
# The FLOPs each timed case's test counts: mqa 2 x visible keys x heads x dim, paged 2 x context x heads x dim.
MQA_FLOPS = {2: 2 * (62 + 63) * 32 * 32, 4: 2 * (60 + 61 + 62 + 63) * 32 * 32}
PAGED_FLOPS = {32: 2 * 104 * 32 * 128, 64: 2 * 104 * 64 * 128}
REAL_US, OURS_US, FP8_TFLOPS = 0.03, 0.01, 100.0  # the fake timer's, and the peak the rates are taken against
REAL_SCHEDULE = "DeepGEMM's schedule"


@pytest.fixture
def fake(tmp_path):
    return write_checkout(tmp_path, FAKE)


class Real(ModuleType):
    """DeepGEMM as the tests call it, recording each call; its logits are a marker the timer tells apart."""

    def __init__(self):
        super().__init__("deep_gemm")
        self.calls = []

    def _call(self, name, **kwargs):
        self.calls.append((name, kwargs))
        return "DeepGEMM's logits"

    def fp8_fp4_mqa_logits(self, **kwargs):
        return self._call("mqa", **kwargs)

    def fp8_fp4_paged_mqa_logits(self, **kwargs):
        return self._call("paged", **kwargs)

    def get_paged_mqa_logits_metadata(self, context_lens, block_kv, num_sms, indices=None):
        return REAL_SCHEDULE

    def get_num_sms(self):
        return 132


def fake_timer(results):
    """bench's timer as the runner calls it: the call made once, its result kept, a set time for each module."""
    def timer(fn):
        results.append(fn())
        return REAL_US if results[-1] == "DeepGEMM's logits" else OURS_US
    return timer


def test_every_sm90_case_is_timed_with_ours_then_deepgemms_at_its_tests_timing_call(fake, monkeypatch):
    """End to end with dsactl's module: each case's test checks DeepGEMM's call first, then its timed call runs
    with `deep_gemm` resolved to ours and then to DeepGEMM's; rows carry the test's own FLOPs."""
    results, real = [], Real()
    monkeypatch.setattr("dsactl.bench.timing.pick_method", lambda: "fake")
    monkeypatch.setattr("dsactl.bench.timing.L2Flusher", lambda: None)
    monkeypatch.setattr("dsactl.bench.peaks.load_or_measure", lambda: type("P", (), {"fp8_tflops": FP8_TFLOPS}))
    monkeypatch.setattr(timing, "bench_timer", lambda method, flusher: fake_timer(results))
    t = timing.time_cases(fake, real)

    assert t.method == "fake" and t.fp8_tflops == FP8_TFLOPS
    assert [(r["test"], r["case"]) for r in t.rows] == [
        ("test_mqa_logits", "is_fp4=False, seq_len=2, what=timed"),
        ("test_mqa_logits", "is_fp4=False, seq_len=4, what=timed"),
        ("test_paged_mqa_logits", "is_fp4=False, num_heads=32"),
        ("test_paged_mqa_logits", "is_fp4=False, num_heads=64")]
    flops = [MQA_FLOPS[2], MQA_FLOPS[4], PAGED_FLOPS[32], PAGED_FLOPS[64]]
    for r, f in zip(t.rows, flops, strict=True):
        assert set(r) == set(timing.TIMING_COLUMNS)
        assert (r["dsactl_us"], r["deepgemm_us"], r["speedup"]) == (OURS_US, REAL_US, 3.0)
        assert r["dsactl_tflops"] == pytest.approx(f / OURS_US / 1e6, abs=0.05)
        assert r["deepgemm_tflops"] == pytest.approx(f / REAL_US / 1e6, abs=0.05)
        assert r["pct_fp8_peak"] == pytest.approx(100 * f / OURS_US / 1e6 / FP8_TFLOPS, abs=0.05)
    (failed, why), (bare, why_bare) = t.untimed
    assert failed == "is_fp4=False, seq_len=4, what=fails" and why.startswith(f"{FAILED}: test_attention.py:")
    assert bare == "is_fp4=False, seq_len=2, what=not timed" and why_bare == "test_mqa_logits made no bench_kineto call"

    # Each timed call: ours (dsactl's logits) then DeepGEMM's, with the inputs the test built.
    assert [type(r) for r in results] == [torch.Tensor, str] * 4
    assert [r.shape for r in results[0:4:2]] == [(2, 64), (4, 64)] and [r.shape for r in results[4::2]] == [(2, 64)] * 2
    # DeepGEMM's calls: each case's check, then its timed call; ours was handed DeepGEMM's own schedule.
    assert [name for name, _ in real.calls] == ["mqa"] * 6 + ["paged"] * 4
    assert real.calls[0][1]["q"][0] is real.calls[1][1]["q"][0]
    assert all(kw["schedule_meta"] == REAL_SCHEDULE for name, kw in real.calls if name == "paged")
    assert "deep_gemm" not in sys.modules


def test_a_case_whose_call_ours_refuses_or_whose_flops_are_not_found_is_listed_untimed(fake, monkeypatch):
    from dsactl.conformance import deep_gemm as conformance

    class Ours(Real):
        def fp8_fp4_paged_mqa_logits(self, **kwargs):
            raise drop_in.CompatError("fp8_fp4_paged_mqa_logits: not served")

    with conformance.deep_gemm_tests(fake) as tests:
        t = timing.run_timings(tests, {timing.OURS: Ours(), timing.THEIRS: Real()}, fake_timer([]),
                               timing.Timings("fake", FP8_TFLOPS))
        assert [r["test"] for r in t.rows] == ["test_mqa_logits"] * 2
        assert [why for _, why in t.untimed][-2:] == [f"{NOT_SERVED}: fp8_fp4_paged_mqa_logits: not served"] * 2

        monkeypatch.setitem(timing.TFLOP_LOCALS, "test_mqa_logits", "tflops_total")
        t = timing.run_timings(tests, {timing.OURS: Real(), timing.THEIRS: Real()}, fake_timer([]),
                               timing.Timings("fake", FP8_TFLOPS))
    assert [r["test"] for r in t.rows] == ["test_paged_mqa_logits"] * 2
    assert "holds no `tflops_total` at its bench_kineto call" in t.untimed[0][1]


def test_a_row_is_deepgemms_time_over_ours_and_the_rates_of_the_tests_flops():
    row = timing.row("test_mqa_logits", "case", {"flops": 4e12, timing.OURS: 5000.0, timing.THEIRS: 4000.0}, 1600.0)
    assert row == {"test": "test_mqa_logits", "case": "case", "dsactl_us": 5000.0, "deepgemm_us": 4000.0,
                   "speedup": 0.8, "dsactl_tflops": 800.0, "deepgemm_tflops": 1000.0, "pct_fp8_peak": 50.0}


@pytest.mark.parametrize("init", ["", "from . import _C\n"])
def test_timing_without_deepgemm_built_in_the_checkout_says_so(fake, capsys, monkeypatch, init):
    """A checkout never built (its package's `from . import _C` fails) or whose package lacks the kernels: one
    line, exit 2, no CSV."""
    (fake / "deep_gemm" / "__init__.py").write_text(init)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["deep_gemm", "--checkout", str(fake), "--time", str(fake / "t.csv")]) == 2
    err = capsys.readouterr().err
    assert "DeepGEMM does not import or run from there (" in err and "reproduce.sh deepgemm-cases" in err
    assert len(err.strip().splitlines()) == 1 and not (fake / "t.csv").exists()
    assert "deep_gemm" not in sys.modules


def test_a_deepgemm_whose_first_call_crashes_is_found_in_a_child_process_and_not_timed(fake, capsys, monkeypatch):
    """DeepGEMM imports with every kernel the timing needs, but its first call kills the process (a build against
    another CUDA or torch): the child process dies, not the run; one line naming the signal, exit 2, no CSV."""
    from dsactl import probe

    (fake / "deep_gemm" / "__init__.py").write_text(
        "import ctypes\n"
        + "".join(f"def {name}(*args, **kwargs):\n    pass\n" for name in timing.REAL_NEEDS)
        + "def fp8_mqa_logits(*args, **kwargs):\n    ctypes.string_at(0)\n")
    monkeypatch.setattr(probe, "DEEP_GEMM", "import deep_gemm; deep_gemm.fp8_mqa_logits()")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["deep_gemm", "--checkout", str(fake), "--time", str(fake / "t.csv")]) == 2
    err = capsys.readouterr().err
    assert "DeepGEMM does not import or run from there (a first call in a child process was killed by SIGSEGV" in err
    assert len(err.strip().splitlines()) == 1 and not (fake / "t.csv").exists()


def test_the_csv_says_how_it_was_made_is_rewritten_after_each_case_and_a_case_left_untimed_fails_the_run(
        fake, monkeypatch, capsys):
    from dsactl.conformance import __main__ as cli

    rows = [timing.row("test_mqa_logits", f"is_fp4=False, n={n}",
                       {"flops": 1e8, timing.OURS: 10.0, timing.THEIRS: 20.0}, FP8_TFLOPS) for n in (1, 2)]
    path, after_first = fake / "out" / "deepgemm-cases.csv", []

    def time_cases(checkout, real, after_case):
        after_case(timing.Timings("cupti", FP8_TFLOPS, rows[:1]))
        after_first.append(path.read_text())
        return timing.Timings("cupti", FP8_TFLOPS, rows, [("is_fp4=False, x=1", "failed: why")])

    monkeypatch.setattr(cli, "_import_built", lambda checkout, name, needs, first_call: (Real(), ""))
    monkeypatch.setattr(timing, "time_cases", time_cases)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    (fake / "COMMIT").write_text("54e22612409371d6364144b69086735beb54e98b\n")
    assert main(["deep_gemm", "--checkout", str(fake), "--time", str(path)]) == 1

    lines = path.read_text().splitlines()
    assert lines[:5] == [f"# command: python -m dsactl.conformance deep_gemm --checkout {fake} --time {path}",
                         "# gpu: NVIDIA H100 80GB HBM3", "# deepgemm: 54e22612409371d6364144b69086735beb54e98b",
                         "# timer: cupti", "# fp8 peak: 100 TFLOP/s (pct_fp8_peak's base)"]
    read = list(csv.DictReader(lines[5:]))
    assert tuple(read[0]) == timing.TIMING_COLUMNS and [r["case"] for r in read] == [r["case"] for r in rows]
    assert (read[0]["speedup"], read[0]["dsactl_tflops"], read[0]["pct_fp8_peak"]) == ("2.0", "10.0", "10.0")
    assert after_first[0].splitlines() == lines[:7] and len(lines) == 8  # the first case alone, then both
    out = capsys.readouterr().out
    assert "is_fp4=False, n=2" in out and "not timed: is_fp4=False, x=1: failed: why" in out
