"""dsactl profile: report parsing on a real H200 report, tables, plots, collection plumbing, errors.

Fixture tests/fixtures/h200_gemm_roofline.ncu-rep: one NVIDIA H200 (ncu 2025.3.1, driver 580.159.04,
torch 2.11), two launches of known work, each alone inside the NVTX ranges dsactl's worker opens
('dsactl', then range_name('probe', <workload>, 'probe')), collected with collect.ncu_command's options
(--set roofline, Occupancy, LaunchStats, --clock-control none, --nvtx-include dsactl/) plus a few extra
tensor counters: workload mm-bf16-4096 is torch `a @ b` on 4096x4096 bf16 (cuBLAS nvjet_sm90, wgmma),
mm-fp8-4096 is torch._scaled_mm on the same shapes in e4m3. Each does 2 * 4096**3 FLOPs.
"""

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dsactl.cli import app
from dsactl.errors import DsactlError
from dsactl.device import gpu_slug
from dsactl.profile import OUTPUTS, analyze, collect, plot, report, worker

pytest.importorskip("ncu_report")

FIXTURE = Path(__file__).parent / "fixtures" / "h200_gemm_roofline.ncu-rep"
GEMM_FLOP = 2 * 4096**3


@pytest.fixture(scope="module")
def launches():
    return report.load([FIXTURE])


def test_fixture_parses_into_one_row_per_launch_with_dsactl_tags(launches):
    assert list(launches["workload"]) == ["mm-bf16-4096", "mm-fp8-4096"]
    assert set(launches["solution"]) == {"probe"} and set(launches["class"]) == {"probe"}
    assert all(k.startswith("nvjet_sm90") for k in launches["kernel"])
    assert launches["duration_us"].round(3).tolist() == [175.296, 101.792]
    assert launches[["grid", "block", "registers", "sms", "active_sms"]].iloc[0].tolist() == [132, 384, 168, 132, 132]
    assert set(launches["_device"]) == {"NVIDIA H200"}


def test_tensor_core_flops_match_the_known_gemm_work(launches):
    # Both the bf16 (HGMMA) and the fp8 (QGMMA) wgmma GEMM count exactly 2*M*N*K tensor FLOPs.
    for flop in launches["tensor_flop"]:
        assert flop == pytest.approx(GEMM_FLOP, rel=1e-6)
    assert launches["flop"].ge(launches["tensor_flop"]).all()
    assert launches["tflops"].iloc[0] == pytest.approx(GEMM_FLOP / 175.296e-6 / 1e12, rel=1e-6)


def test_utilisation_and_traffic_are_consistent(launches):
    for col in report.PCT_COLUMNS:
        assert launches[col].between(0, 100).all(), col
    assert (launches["sm_pct"] > 80).all()  # compute-bound GEMMs keep the SMs busy
    assert launches["dram_bytes"].gt(0).all()
    gbs = launches["dram_bytes"] / (launches["duration_us"] * 1e-6) / 1e9
    assert gbs.tolist() == pytest.approx(launches["dram_gbs"].tolist())
    assert launches["intensity"].tolist() == pytest.approx((launches["flop"] / launches["dram_bytes"]).tolist())


def test_tensor_rate_metrics_count_each_float_type_once():
    names = [f"sm__ops_path_tensor_src_{t}.sum.per_cycle_elapsed" for t in (
        "bf16_dst_fp32", "fp8_sparsity_off", "fp8_sparsity_on", "int8", "tf32_dst_fp32",
        "fp4_fp6_fp8_dst_fp32", "fp4_fp6_fp8_dst_fp32_sparsity_on")]
    names.append("sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum.per_cycle_elapsed")
    picked = {n.split("src_")[1].split(".sum")[0] for n in report.tensor_rate_metrics(names)}
    assert picked == {"bf16_dst_fp32", "fp8_sparsity_off", "fp8_sparsity_on", "tf32_dst_fp32", "fp4_fp6_fp8_dst_fp32"}


def test_unit_scale_reads_ncu_units():
    assert report._unit_scale("ns") == 1e-9
    assert report._unit_scale("usecond") == 1e-6
    assert report._unit_scale("Kbyte/s") == 1e3
    assert report._unit_scale("byte/usecond") == 1e6
    assert report._unit_scale("%") == report._unit_scale("") == report._unit_scale("inst/cycle") == 1.0


def _launch(kernel, label, duration_us, sm_pct, flop, dram_bytes, tensor_pct=math.nan):
    row = dict.fromkeys(report.COLUMNS, math.nan)
    row.update(solution="s", workload=f"w-{label}", kernel=kernel, **{"class": label}, duration_us=duration_us,
               registers=64, sms=132, active_sms=min(132, int(duration_us)), sm_pct=sm_pct, l1_pct=sm_pct / 2,
               l2_pct=10.0, dram_pct=20.0, tensor_pct=tensor_pct, flop=flop, dram_bytes=dram_bytes)
    return row


def test_by_class_weighs_utilisation_by_time_and_rates_by_total_work():
    k = pd.DataFrame([_launch("a", "short", 10.0, 90.0, 1e9, 1e6), _launch("a", "short", 30.0, 10.0, 3e9, 1e7),
                      _launch("a", "long", 100.0, 50.0, 2e10, 1e8, tensor_pct=40.0),
                      _launch("b", "long", 5.0, 70.0, 0.0, 1e6)])
    c = report.by_class(k).set_index(["kernel", "class"])
    short = c.loc[("a", "short")]
    assert short["launches"] == 2 and short["duration_us"] == 20.0
    assert short["sm_pct"] == pytest.approx((90 * 10 + 10 * 30) / 40)
    assert short["tflops"] == pytest.approx(4e9 / 40e-6 / 1e12)
    assert short["dram_gbs"] == pytest.approx(1.1e7 / 40e-6 / 1e9)
    assert short["intensity"] == pytest.approx(4e9 / 1.1e7)
    assert math.isnan(short["tensor_pct"]) and c.loc[("a", "long")]["tensor_pct"] == 40.0
    assert len(c) == 3  # one row per (solution, kernel, class)


class _Metric:
    ValueKind_STRING = 0

    def __init__(self, value):
        self.value = value

    def has_value(self):
        return True

    def kind(self):
        return 1

    def as_double(self):
        return self.value

    def unit(self):
        return "inst"


class _Action:
    def __init__(self, metrics):
        self.metrics = metrics

    def metric_by_name(self, name):
        return _Metric(self.metrics[name]) if name in self.metrics else None


def _stall(reason):
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def test_warp_state_names_the_largest_waits():
    # As ncu recorded the small-head attention kernel on the H200 (16 heads, 256 tokens).
    ratios = {"long_scoreboard": 1.69, "wait": 1.09, "barrier": 0.73, "selected": 1.0, "short_scoreboard": 0.46,
              "not_selected": 0.22, "gmma": 0.0}
    metrics = {_stall(r): v for r, v in ratios.items()}
    action = _Action(metrics)
    found = report.stall_ratios(action, [*metrics, "smsp__inst_executed.sum"])
    assert found == ratios
    assert report.top_stalls(found) == "long_scoreboard 1.69, wait 1.09, barrier 0.73"  # "selected" is no wait
    assert report.top_stalls({}) == ""


def test_by_class_weighs_stall_reasons_by_time():
    rows = [_launch("a", "c", 10.0, 50.0, 1e9, 1e6), _launch("a", "c", 30.0, 50.0, 1e9, 1e6)]
    for row, (wait, barrier) in zip(rows, ((4.0, 1.0), (0.0, 2.0))):
        row.update(_stalls={"wait": wait, "barrier": barrier, "selected": 1.0}, cycles_per_issue=wait + barrier + 1,
                   issue_pct=20.0, instructions=1e6, stalls="", smem_conflicts=0.0)
    c = report.by_class(pd.DataFrame(rows)).iloc[0]
    assert c["stalls"] == "barrier 1.75, wait 1.00"  # (1*10 + 2*30)/40, (4*10 + 0*30)/40
    assert c["cycles_per_issue"] == pytest.approx((6 * 10 + 3 * 30) / 40)
    assert c["issue_pct"] == 20.0 and c["instructions"] == 1e6


def test_a_roofline_report_shows_no_warp_state(launches):
    assert launches["cycles_per_issue"].isna().all() and (launches["stalls"] == "").all()
    row = report.formatted(launches[list(report.COLUMNS)])[0]
    for column in ("issue_pct", "cycles_per_issue", "stalls", "instructions", "smem_conflicts"):
        assert row[report.COLUMNS.index(column)] == "-"


def test_markdown_table_has_a_header_and_one_line_per_row(launches):
    md = report.to_markdown(report.by_class(launches[list(report.COLUMNS)])).splitlines()
    assert md[0].startswith("| solution | kernel | class |") and md[1].startswith("|---|")
    assert len(md) == 4 and "| 784.04 |" in md[2]


def test_roofs_prefer_bench_measurements_when_cached(launches, tmp_path):
    ncu = plot.roofs(launches, "NVIDIA H200", tmp_path / "none.json")
    assert ncu.dram_bytes_per_s == pytest.approx(4.81e12, rel=0.01)  # HBM3e peak at the profiled DRAM clock
    assert [name for name, _ in ncu.compute] == ["fp8 tensor", "bf16 tensor", "FP32"]
    assert ncu.source.startswith("ncu")
    cache = tmp_path / "peaks.json"
    cache.write_text('{"NVIDIA H200": {"gpu": "NVIDIA H200", "copy_gbps": 4300.0, "bf16_tflops": 790.0, '
                     '"measured_at": "2026-11-29T10:00:00", "torch": "2.11"}}')
    bench = plot.roofs(launches, "NVIDIA H200", cache)
    assert bench.dram_bytes_per_s == 4.3e12 and dict(bench.compute)["bf16 tensor"] == 790e12
    assert dict(bench.compute)["fp8 tensor"] == dict(ncu.compute)["fp8 tensor"]
    assert "dsactl bench" in bench.source


def test_import_writes_tables_and_plots(tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["profile", "--import", str(FIXTURE), "-o", str(out)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "mm-bf16-4096" in r.output and "roofs" in r.output
    for name in (*OUTPUTS, "command.txt"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "roofline.png").read_bytes()[:4] == b"\x89PNG"
    assert len(pd.read_csv(out / "kernels.csv")) == 2 and len(pd.read_csv(out / "classes.csv")) == 2


def test_analyze_default_folder_is_named_for_the_gpu():
    assert gpu_slug("NVIDIA H200") == "h200" and gpu_slug("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090"


def _error(*args, env=None) -> str:
    """The DsactlError message a command ends with (main() prints it as one `error:` line)."""
    r = CliRunner().invoke(app, list(args), env=env)
    assert isinstance(r.exception, DsactlError), r.output
    return str(r.exception)


def test_collect_without_ncu_says_how_to_get_it(tmp_path):
    message = _error("profile", "--ncu", "roofline", env={"PATH": str(tmp_path)})
    assert message.startswith("Nsight Compute (ncu) is not on PATH") and "--import" in message


def test_profile_needs_exactly_one_of_ncu_and_import():
    for args in ((), ("--ncu", "roofline", "--import", str(FIXTURE))):
        assert "either --ncu roofline" in _error("profile", *args)


def test_unreadable_report_is_a_clear_error(tmp_path):
    with pytest.raises(DsactlError, match="no such report"):
        report.load([tmp_path / "missing.ncu-rep"])
    bogus = tmp_path / "bogus.ncu-rep"
    bogus.write_bytes(b"not a report")
    with pytest.raises(DsactlError):
        report.load([bogus])


@pytest.mark.parametrize("text, rc, expected", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", 1, "NVreg_RestrictProfilingToAdminUsers=0"),
    ("==ERROR== Failed to initialize the profiler: LibraryNotLoaded", 1, "LibraryNotLoaded"),
    ("error: solution x: cannot load m:f (No module named 'm')\n==ERROR== The application returned an error code (2).",
     2, "cannot load m:f"),
    ("Traceback (most recent call last):\nRuntimeError: CUDA error: out of memory\n==ERROR== The application", 1,
     "RuntimeError: CUDA error: out of memory"),
    ("==PROF== Disconnected from process 1\n==WARNING== No kernels were profiled.", 0, "profiled no kernel"),
])
def test_ncu_failures_become_one_clear_message(text, rc, expected):
    with pytest.raises(DsactlError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        collect.check_output(rc, text, Path("x.ncu.log"))


def test_ncu_command_profiles_only_the_nvtx_range():
    selection = collect.Selection("contest", None, None, ("contest-indexer-000", "contest-indexer-100"), "s")
    cmd = collect.ncu_command("ncu", Path("out/s.ncu-rep"), collect.worker_command(selection, 3))
    assert cmd[:7] == ["ncu", "--set", "roofline", "--section", "Occupancy", "--section", "LaunchStats"]
    assert ["--clock-control", "none"] == cmd[cmd.index("--clock-control"):][:2]
    assert cmd[cmd.index("--nvtx-include") + 1] == "dsactl/" and "--nvtx" in cmd
    assert cmd[cmd.index("--export") + 1] == "out/s.ncu-rep"
    program = cmd[cmd.index("--export") + 2:]
    assert program[:3] == [sys.executable, "-m", "dsactl.profile.worker"]
    assert worker.parse_args(program[3:]) == (selection, 3)
    with pytest.raises(DsactlError, match="unknown ncu section set"):
        collect.ncu_command("ncu", Path("x"), [], "everything")
    # warps: the roofline sections, then the warp state and every stall reason.
    warps = collect.ncu_command("ncu", Path("out/s.ncu-rep"), collect.worker_command(selection, 3), "warps")
    assert warps[:7] == cmd[:7] and warps[warps.index("--clock-control"):] == cmd[cmd.index("--clock-control"):]
    for section in ("WarpStateStats", "SchedulerStats", "InstructionStats", "MemoryWorkloadAnalysis_Tables"):
        assert section in warps
    assert re.fullmatch(warps[warps.index("--metrics") + 1].removeprefix("regex:"),
                        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio")


def test_range_names_round_trip():
    name = collect.range_name("dsactl-indexer", "contest-indexer-007", "passthrough")
    assert collect.parse_range_name(name) == {"solution": "dsactl-indexer", "workload": "contest-indexer-007",
                                              "label": "passthrough"}
    assert collect.parse_range_name("some other range") is None


def test_plan_pairs_solutions_with_the_workloads_they_serve():
    (t,) = collect.plan(collect.Selection(solution="torch-indexer", workloads=("contest-indexer-000",)))
    assert t.solution.name == "torch-indexer" and [w.uuid for w in t.workloads] == ["contest-indexer-000"]
    with pytest.raises(DsactlError, match="no workload 'nope'"):
        collect.plan(collect.Selection(workloads=("nope",)))
    with pytest.raises(DsactlError, match="serves none"):
        collect.plan(collect.Selection(solution="torch-indexer", workloads=("contest-attention-000",)))


def test_plan_adds_each_baseline_on_the_workloads_it_serves():
    selection = collect.Selection(workloads=("contest-indexer-000", "contest-attention-000"), solution="dsactl-indexer",
                                  baselines=("torch-indexer", "flashmla"))
    targets = collect.plan(selection)
    assert [(t.name, t.solution is None, [w.uuid for w in t.workloads]) for t in targets] == [
        ("dsactl-indexer", False, ["contest-indexer-000"]),
        ("torch-indexer", True, ["contest-indexer-000"]),
        ("flashmla", True, ["contest-attention-000"]),
    ]
    # A worker gets one contender: its solution, or one baseline and no solution.
    assert [collect.worker_selection(selection, t) for t in targets][1:] == [
        collect.Selection(workloads=selection.workloads, baselines=("torch-indexer",)),
        collect.Selection(workloads=selection.workloads, baselines=("flashmla",)),
    ]
    (only,) = collect.plan(collect.Selection(workloads=("contest-attention-000",), baselines=("flashmla",)),
                           solutions_too=False)
    assert only.name == "flashmla"


@pytest.mark.parametrize("names,message", [
    (("nope",), "unknown baseline 'nope'"),
    (("reference",), "not a kernel to profile"),
])
def test_plan_refuses_unknown_baselines_and_the_reference(names, message):
    with pytest.raises(DsactlError, match=message):
        collect.plan(collect.Selection(workloads=("contest-indexer-000",), baselines=names))


def test_plan_says_when_neither_the_solution_nor_a_baseline_serves_the_workloads():
    with pytest.raises(DsactlError, match="none of solution 'torch-indexer', baseline 'flashmla' serves any of the 1"):
        collect.plan(collect.Selection(workloads=("edge-topk-mtp",), solution="torch-indexer", baselines=("flashmla",)))


def test_worker_arguments_round_trip_with_a_baseline():
    selection = collect.Selection("scale", None, "dsa_sparse_attention_h64*", ("scale-attention-h64-t128-fp8",),
                                  None, ("flashmla",))
    assert worker.parse_args(collect.worker_command(selection, 5)[3:]) == (selection, 5)
    with pytest.raises(SystemExit):  # a worker profiles a solution or baselines, never both
        worker.parse_args(["--solution", "a", "--baseline", "b"])


@pytest.mark.parametrize("as_baseline", [False, True])
def test_worker_binds_the_call_it_profiles(as_baseline):
    """The worker's warmed-up call: a baseline solution bound as bench binds it, or run as a solution; both
    write the indexer's top-k."""
    if as_baseline:
        (target,) = collect.plan(collect.Selection(workloads=("contest-indexer-070",), baselines=("torch-indexer",)),
                                 solutions_too=False)
    else:
        (target,) = collect.plan(collect.Selection(workloads=("contest-indexer-070",), solution="torch-indexer"))
    fn = worker.bound_call(target, target.workloads[0], seed=3, device="cpu")
    out = fn.args[-1]  # the call's preallocated top-k ids, poisoned before this call when run as a solution
    out.fill_(-7)
    fn()
    assert ((out >= -1).all() and (out >= 0).any()).item()


FAKE_NCU = """#!{python}
import shutil, sys
args = sys.argv[1:]
print("==PROF== Connected to process 1")
print("dsactl-profile skipped contest-indexer-001: too long for this test")
shutil.copy({fixture!r}, args[args.index("--export") + 1])
print("==PROF== Report:", args[args.index("--export") + 1])
"""


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """An `ncu` first on PATH that exports FIXTURE as its report, whatever it is asked to run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable, fixture=str(FIXTURE)))
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(shutil.which('sh')).parent}")


def test_collect_runs_ncu_per_solution_and_reads_its_report(tmp_path, fake_ncu):
    selection = collect.Selection(solution="torch-indexer", workloads=("contest-indexer-000", "contest-indexer-001"))
    (c,) = collect.collect(selection, tmp_path / "out")
    assert c.solution == "torch-indexer" and c.workloads == 2
    assert c.report == tmp_path / "out" / "torch-indexer.ncu-rep" and c.report.is_file()
    assert c.skipped == (("contest-indexer-001", "too long for this test"),)
    assert "dsactl.profile.worker --solution torch-indexer" in c.log.read_text().splitlines()[0]
    a = analyze([c.report], tmp_path / "out", "dsactl profile --ncu roofline", tmp_path / "no-peaks.json")
    assert a.device == "NVIDIA H200" and len(a.kernels) == 2


def test_collect_profiles_a_baseline_in_its_own_worker_and_skips_one_that_cannot_run(tmp_path, fake_ncu,
                                                                                    monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a plug-in then cannot run: skipped, not lost
    selection = collect.Selection(workloads=("contest-indexer-000", "contest-attention-000"), solution="torch-indexer",
                                  baselines=("torch-topk", "flashmla"))
    solution, unserved, plugin = collect.collect(selection, tmp_path / "out")
    assert solution.solution == "torch-indexer" and solution.report.is_file()
    assert "--solution torch-indexer" in solution.log.read_text().splitlines()[0]
    # Named baselines are reported, never dropped: one serves neither workload, one cannot run without a GPU.
    assert (unserved.solution, unserved.report, unserved.skipped) == (
        "torch-topk", None, (("torch-topk", "serves none of the selected workloads"),))
    assert (plugin.solution, plugin.report, plugin.skipped) == ("flashmla", None, (("flashmla", "needs a CUDA GPU"),))
    # A baseline that runs gets its own worker and report.
    (baseline,) = collect.collect(collect.Selection(workloads=("contest-indexer-000",), solution="torch-topk",
                                                    baselines=("torch-indexer",)), tmp_path / "out2")
    assert baseline.solution == "torch-indexer" and baseline.report == tmp_path / "out2" / "torch-indexer.ncu-rep"
    worker_args = baseline.log.read_text().splitlines()[0].split(" -m dsactl.profile.worker ")[1].split()
    assert worker.parse_args(worker_args)[0] == collect.Selection(workloads=("contest-indexer-000",),
                                                                  baselines=("torch-indexer",))


@pytest.mark.gpu
def test_profile_a_shipped_kernel_on_this_gpu(tmp_path):
    if shutil.which("ncu") is None:
        pytest.skip("needs Nsight Compute (ncu)")
    r = subprocess.run([sys.executable, "-m", "dsactl", "profile", "--ncu", "warps", "--solution", "dsactl-indexer",
                        "--workload", "contest-indexer-100", "-o", str(tmp_path)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    k = pd.read_csv(tmp_path / "kernels.csv")
    assert set(k["solution"]) == {"dsactl-indexer"} and set(k["class"]) == {"scored"}
    assert k["tensor_flop"].max() > 0  # the FP8 scoring kernel runs on the tensor cores
    # The warp state: an issued instruction costs at least its own cycle; the waits are named.
    assert (k["cycles_per_issue"] >= 1).all() and k["issue_pct"].between(0, 100, inclusive="right").all()
    assert (k["instructions"] > 0).all() and k["smem_conflicts"].notna().all()
    assert k["stalls"].str.match(r"^[a-z_]+ \d+\.\d\d").all()
    assert pd.read_csv(tmp_path / "classes.csv")["stalls"].notna().all()


@pytest.mark.gpu
def test_profile_puts_a_baseline_beside_our_kernel_in_one_table(tmp_path):
    if shutil.which("ncu") is None:
        pytest.skip("needs Nsight Compute (ncu)")
    r = subprocess.run([sys.executable, "-m", "dsactl", "profile", "--ncu", "roofline", "--solution", "dsactl-indexer",
                        "-b", "torch-indexer", "--workload", "contest-indexer-100", "-o", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    k = pd.read_csv(tmp_path / "kernels.csv")
    assert set(k["solution"]) == {"dsactl-indexer", "torch-indexer"} and set(k["workload"]) == {"contest-indexer-100"}


def test_reading_after_collection_runs_in_a_child_and_survives_its_crash(tmp_path, monkeypatch):
    from dsactl.errors import DsactlError
    from dsactl.profile import analyze_in_child

    a = analyze_in_child([FIXTURE], tmp_path / "out", "dsactl profile --ncu roofline")
    direct = analyze([FIXTURE], tmp_path / "direct", "dsactl profile --ncu roofline")
    assert list(a.kernels["duration_us"]) == pytest.approx(list(direct.kernels["duration_us"]))
    assert a.roofs == direct.roofs and a.device == direct.device
    # A child killed by a signal (as ncu's own ncu_report did on the H200) becomes a clear error.
    crash = tmp_path / "crash.py"
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    (tmp_path / "python").write_text(f"#!/bin/sh\nexec {sys.__dict__.get('_base_executable', 'python3')} {crash}\n")
    (tmp_path / "python").chmod(0o755)
    with pytest.raises(DsactlError, match=r"reading them failed \(signal 11\).*dsactl profile --import"):
        analyze_in_child([FIXTURE], tmp_path / "out2", "x")


def test_our_kernels_reports_import_with_full_tables():
    """tests/fixtures/ncu/<family>.ncu-rep: one workload per kernel family profiled on the H200 by
    profiles/reproduce.sh (area ncu, --ncu warps); each imports offline with its SM/L1/L2/DRAM columns and
    its warp state."""
    families = {"indexer": {"indexer_score_kernel", "topk_row_kernel"}, "topk": {"topk_page_transform_kernel"},
                "attention": {"_sparse_mla_bf16_kernel", "_sparse_mla_combine_kernel"}}
    for family, kernels in families.items():
        launches = report.load([Path(__file__).parent / "fixtures" / "ncu" / f"{family}.ncu-rep"])
        assert kernels <= set(launches["kernel"]), (family, set(launches["kernel"]))
        for column in ("sm_pct", "l1_pct", "l2_pct", "dram_pct"):
            assert launches[column].notna().all() and (launches[column] >= 0).all(), (family, column)
        assert (launches["duration_us"] > 0).all() and (launches["active_sms"] > 0).all()
        # Collected with --ncu warps: why each kernel waits, and what it issued.
        assert (launches["cycles_per_issue"] >= 1).all() and launches["issue_pct"].between(0, 100).all(), family
        assert (launches["instructions"] > 0).all() and launches["smem_conflicts"].notna().all(), family
        assert launches["stalls"].str.fullmatch(r"([a-z_]+ \d+\.\d\d)(, [a-z_]+ \d+\.\d\d){2}").all(), family
    attention = report.load([Path(__file__).parent / "fixtures" / "ncu" / "attention.ncu-rep"])
    assert (attention[attention["kernel"] == "_sparse_mla_bf16_kernel"]["tensor_pct"] > 0).all(), \
        "tensor-core work must be counted"
