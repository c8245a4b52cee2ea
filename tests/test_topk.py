"""Exact top-k with page-table translation: the PyTorch model of the algorithm (CPU) and the
CUDA kernel (GPU) against the definition's reference, compared as sets per row.

Ties make the chosen ids legitimately differ from the reference's, so a row is checked by:
exactly min(topk, length) ids and -1 elsewhere, no duplicates, every id a valid position of
the row (its page in the row's block table, position < length), and the sorted rank keys of
the chosen positions equal to the reference's (which is set equality when there are no ties).
"""

from __future__ import annotations

import pytest
import torch

from dsactl.definitions import get
from dsactl.definitions.topk import rank_key
from dsactl.kernels.errors import KernelError
from dsactl.fp8 import PAGE_SIZE
from dsactl.harness import INT_POISON
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.topk import torch_baseline
from dsactl.kernels.topk.launcher import (MAX_PAGES, MAX_TOPK, bad_index_count, check_inputs, dsa_topk_page_transform,
                                          launch_plan, reset_bad_index_count, topk_page_transform)
from dsactl.kernels.topk.model import BINS, ROW_MAX_LEN, levels, radix_keys, topk_page_transform_model

TOPK = 2048
CROWD = 20_000  # values sharing one radix bin (the adversarial case)
PATTERNS = ("random", "all_equal", "two_values", "coarse_bin", "fine_bin", "ascending", "descending",
            "neg_inf_tail", "nan")
CPU_LENGTHS = (1, 63, 64, 2047, 2048, 2049, 5824, 6145, 65536)
GPU_LENGTHS = CPU_LENGTHS + (131072, 1_048_576)
# Rows of max_len <= ROW_MAX_LEN run the register-resident kernel (8 or 16 keys per thread).
ROW_LENGTHS = {4096: (1, 63, 64, 2047, 2048, 2049, 3001, 4095, 4096),
               ROW_MAX_LEN: (1, 64, 2048, 2049, 4097, 5824, 6145, 8191, ROW_MAX_LEN)}
DTYPES = (torch.float32, torch.bfloat16)


def scores_row(pattern: str, length: int, g: torch.Generator) -> torch.Tensor:
    """float32 scores of one row (converted to the tested dtype by the caller)."""
    row = torch.randn(length, generator=g) * 3
    if pattern == "all_equal":
        row.fill_(0.625)
    elif pattern == "two_values":
        row = torch.where(torch.rand(length, generator=g) < 0.5, 1.5, -2.25)
    elif pattern in ("coarse_bin", "fine_bin"):
        # CROWD values above everything else: fp32 keys equal in the top 11 bits (coarse) or
        # the top 22 bits (fine); in bf16 the fine ones round to one value.
        low_bits = 1 << (21 if pattern == "coarse_bin" else 10)
        crowd = torch.randint(0, low_bits, (length,), generator=g, dtype=torch.int32)
        crowd = (torch.tensor(1.0).view(torch.int32) + crowd).view(torch.float32)
        row = torch.where(torch.randperm(length, generator=g) < CROWD, crowd, row.abs() * 0.01)
    elif pattern == "ascending":
        row = torch.arange(length, dtype=torch.float32) * 0.001 - 1.0
    elif pattern == "descending":
        row = 1.0 - torch.arange(length, dtype=torch.float32) * 0.001
    elif pattern == "neg_inf_tail":
        row[min(length, 1000):] = float("-inf")  # rows longer than 1000 select -inf scores
    elif pattern == "nan":
        row[torch.rand(length, generator=g) < 0.3] = float("nan")
        row[length // 2:] = float("nan")  # half the row: NaNs are selected in rows <= 2 * topk
        row[:3] = torch.tensor([float("-inf"), -0.0, 0.0])[:length]
    return row


def make_case(lengths, dtype, pattern="random", rows_per_request=1, seed=0, max_len=None, device="cpu"):
    """Inputs of the definition: shuffled distinct pages per request, scores beyond a row's
    length random (they must be ignored)."""
    g = torch.Generator().manual_seed(seed)
    max_len = max_len or max(lengths)
    rows = len(lengths)
    scores = torch.randn(rows, max_len, generator=g) * 100
    for r, length in enumerate(lengths):
        scores[r, :length] = scores_row(pattern, length, g)
    batch = -(-rows // rows_per_request)
    max_pages = -(-max_len // PAGE_SIZE)
    block_table = torch.randperm(batch * max_pages + 7, generator=g)[: batch * max_pages].view(batch, max_pages)
    return {
        "scores": scores.to(dtype).to(device),
        "lengths": torch.tensor(lengths, dtype=torch.int32, device=device),
        "block_table": block_table.to(torch.int32).to(device),
        "row_to_batch": (torch.arange(rows, dtype=torch.int32) // rows_per_request).to(device),
    }


def assert_same_topk(out: torch.Tensor, ref: torch.Tensor, case: dict, topk: int, label: str = "") -> None:
    """The module docstring's per-row check."""
    out, ref = out.cpu().long(), ref.cpu().long()
    scores = case["scores"].cpu()
    lengths, row_to_batch = case["lengths"].cpu(), case["row_to_batch"].cpu()
    block_table = case["block_table"].cpu().long()
    num_physical = int(block_table.max()) + 1
    for r in range(out.shape[0]):
        length = min(max(int(lengths[r]), 0), scores.shape[1])
        n = min(topk, length)
        where = f"{label} row {r} (length {length})"
        chosen = out[r][out[r] != -1]
        assert chosen.numel() == n and int((out[r] == -1).sum()) == topk - n, \
            f"{where}: {chosen.numel()} ids, expected {n}, then -1 padding (min value {int(out[r].min())})"
        assert chosen.unique().numel() == n, f"{where}: duplicate ids"
        b = int(row_to_batch[r])
        # Only the row's first ceil(length / 64) pages are its own; slots past them hold padding
        # or arbitrary page ids (possibly repeating these) that must never be mapped back.
        own = -(-length // PAGE_SIZE)
        page_pos = torch.full((num_physical,), -1, dtype=torch.long)
        page_pos[block_table[b, :own]] = torch.arange(own)
        assert bool(((chosen >= 0) & (chosen < num_physical * PAGE_SIZE)).all()), f"{where}: id out of range"
        logical = page_pos[chosen // PAGE_SIZE] * PAGE_SIZE + chosen % PAGE_SIZE
        assert bool(((page_pos[chosen // PAGE_SIZE] >= 0) & (logical < length)).all()), \
            f"{where}: id outside the row's valid positions"
        ref_ids = ref[r][ref[r] != -1]
        ref_logical = page_pos[ref_ids // PAGE_SIZE] * PAGE_SIZE + ref_ids % PAGE_SIZE
        got = rank_key(scores[r, logical]).sort().values
        want = rank_key(scores[r, ref_logical]).sort().values
        assert torch.equal(got, want), f"{where}: the chosen scores differ from the reference's top-{topk}"


def reference(case: dict, topk: int) -> torch.Tensor:
    bf16 = case["scores"].dtype == torch.bfloat16
    return get(f"dsa_topk_page_transform_topk{topk}_ps64" + ("_bf16" if bf16 else "")).reference(
        case["scores"], case["lengths"], case["block_table"], case["row_to_batch"], topk=topk)


# ---------------------------------------------------------------------------------------------
# CPU: keys and the model of the algorithm.

@pytest.mark.parametrize("dtype", DTYPES)
def test_model_radix_keys_order_is_the_contract_order(dtype):
    g = torch.Generator().manual_seed(1)
    special = torch.tensor([float("nan"), float("-inf"), -3.0, -0.0, 0.0, 1e-30, 2.5, float("inf")])
    values = torch.cat([special, torch.randn(2000, generator=g) * 10]).to(dtype)
    keys = radix_keys(values)
    ranks = rank_key(values.float())
    assert bool((keys >= 0).all()) and int(keys.max()) < 2 ** (32 if dtype == torch.float32 else 16)
    i, j = torch.randint(0, values.numel(), (2, 20000), generator=g)
    assert torch.equal(keys[i] < keys[j], ranks[i] < ranks[j])
    assert torch.equal(keys[i] == keys[j], ranks[i] == ranks[j])  # -0.0 == +0.0, NaN == NaN


def test_model_levels_cover_every_key_bit_once():
    for bits, widths in ((32, [11, 11, 10]), (16, [11, 5])):
        lv = levels(bits)
        assert [bin(m).count("1") for _, m in lv] == widths
        combined = 0
        for shift, mask in lv:
            assert combined & mask == 0 and mask >> shift < BINS
            combined |= mask
        assert combined == (1 << bits) - 1


# (cluster_size, region_bytes): the kernel's paths. 205 KB is the H200's region: rows up to 52K
# fp32 keys are cached, 65536 is not (compaction); 4 KB forces compaction per chunk and, with
# CROWD values in one bin, the overflow fallback over global memory.
MODEL_CONFIGS = {"one-cta": (1, 205 * 1024), "cluster4": (4, 205 * 1024), "cluster16": (16, 205 * 1024),
                 "small-region": (2, 4096)}


@pytest.mark.parametrize("config", MODEL_CONFIGS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_matches_reference(dtype, pattern, config):
    cluster_size, region_bytes = MODEL_CONFIGS[config]
    case = make_case(CPU_LENGTHS, dtype, pattern, seed=len(pattern))
    out, _ = topk_page_transform_model(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"],
                                       TOPK, cluster_size, region_bytes)
    assert_same_topk(out, reference(case, TOPK), case, TOPK, f"{pattern}/{config}")


@pytest.mark.parametrize("max_len", ROW_LENGTHS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_row_kernel_matches_reference(dtype, pattern, max_len):
    case = make_case(ROW_LENGTHS[max_len], dtype, pattern, seed=max_len + len(pattern))
    trace: list[str] = []
    out, _ = topk_page_transform_model(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"],
                                       TOPK, trace=trace)
    assert trace == [f"row-kernel max_len={max_len}"], trace
    assert_same_topk(out, reference(case, TOPK), case, TOPK, f"{pattern}/row")


@pytest.mark.parametrize("dtype", DTYPES)
def test_model_takes_the_overflow_fallback_and_stays_exact(dtype):
    case = make_case([30000, 9000], dtype, "coarse_bin", rows_per_request=2)
    trace: list[str] = []
    out, _ = topk_page_transform_model(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"],
                                       TOPK, cluster_size=2, region_bytes=4096, trace=trace)
    assert any(t.startswith("overflow") for t in trace), trace
    assert_same_topk(out, reference(case, TOPK), case, TOPK)


@pytest.mark.parametrize("bf16", (False, True))
def test_model_on_edge_workloads(bf16):
    from dsactl.workloads import make_inputs, suite

    name = "dsa_topk_page_transform_topk2048_ps64" + ("_bf16" if bf16 else "")
    workloads = [w for w in suite("edge") if w.definition == name]
    assert workloads
    for w in workloads:
        case = make_inputs(w, "cpu", seed=11)
        out, _ = topk_page_transform_model(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"],
                                           TOPK, 2, 4096)
        assert_same_topk(out, reference(case, TOPK), case, TOPK, w.uuid)


@pytest.mark.parametrize("topk", (1, 7, 512, 1024))
def test_model_other_k(topk):
    case = make_case([1, topk, topk + 1, 5000], torch.float32, "two_values", seed=topk)
    out, _ = topk_page_transform_model(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"],
                                       topk, 2, 4096)
    assert_same_topk(out, reference(case, topk), case, topk)


def hostile_case(max_len: int, device: str = "cpu", seed: int = 21) -> tuple[dict, int]:
    """Distinct scores (one top set per row) with bad values: page ids -7, -1, NUM_PAGES and 5e7 among
    the rows' pages, a row whose batch is past the block table, one whose batch is negative, lengths
    past max_len and past the pages; and the page bound the kernel is given."""
    lengths = [max_len, 3000, 2047, max_len, 100, 9]
    case = make_case(lengths, torch.float32, "random", seed=seed, max_len=max_len)
    case["lengths"][3] = max_len + 500
    rows = len(lengths)
    case["scores"] = (torch.randperm(rows * max_len, generator=torch.Generator().manual_seed(seed))
                      .float().view(rows, max_len) / 7.0)
    table = case["block_table"]
    num_pages = int(table.max()) + 1
    for (b, p), page in zip([(0, 1), (0, 5), (1, 2), (1, 30), (3, 0), (4, 1)], (-7, -1, num_pages, 50_000_000,
                                                                                 -2**31, MAX_PAGES)):
        table[b, p] = page
    case["row_to_batch"][4] = table.shape[0]
    case["row_to_batch"][5] = -3
    return {k: v.to(device) for k, v in case.items()}, num_pages


def due_minus_written(out: torch.Tensor, case: dict, topk: int) -> int:
    """The ids due (min(topk, clamped length) a row) that out holds as -1: what the counter must say."""
    max_len, pages = case["scores"].shape[1], case["block_table"].shape[1]
    lengths = case["lengths"].cpu().long().clamp(0, min(max_len, pages * PAGE_SIZE))
    return int(lengths.clamp(max=topk).sum()) - int((out != -1).sum())


def assert_same_ids(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert torch.equal(out.cpu().sort(dim=1).values, ref.cpu().sort(dim=1).values)


@pytest.mark.parametrize("max_len", (5000, 20000))  # the row kernel's and the cluster kernel's
def test_model_and_baseline_mask_bad_pages_and_batches_as_the_reference(max_len):
    case, num_pages = hostile_case(max_len)
    ref = reference(case, TOPK)
    inside = case["block_table"] < num_pages
    case_at_bound = dict(case, block_table=torch.where(inside, case["block_table"], MAX_PAGES).int())
    want = reference(case_at_bound, TOPK)  # pages past num_pages masked as the reference masks MAX_PAGES
    assert (want == -1).sum() > (ref == -1).sum() > 0
    got, masked = topk_page_transform_model(case["scores"], case["lengths"], case["block_table"],
                                            case["row_to_batch"], TOPK, 2, 4096, num_pages=num_pages)
    assert_same_ids(got, want)
    assert masked == due_minus_written(want, case, TOPK) > 0
    baseline = torch.full((6, TOPK), INT_POISON, dtype=torch.int32)
    torch_baseline.topk_page_transform(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"],
                                       baseline, num_pages=num_pages)
    assert_same_ids(baseline, want)
    assert (ref[4:] == -1).all() and (ref[:4] != -1).any()  # rows 4 and 5: batch outside the block table


def test_reference_and_baseline_on_an_empty_block_table():
    case = make_case([100, 0], torch.float32, seed=4)
    case["block_table"] = torch.empty(0, 3, dtype=torch.int32)
    ref = reference(case, 64)
    baseline = torch.full((2, 64), INT_POISON, dtype=torch.int32)
    torch_baseline.topk_page_transform(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"],
                                       baseline)
    assert (ref == -1).all() and (baseline == -1).all()


def launcher_args(rows: int = 3, max_len: int = 300, topk: int = 64) -> dict:
    case = make_case([max_len] * rows, torch.float32, seed=rows)
    return {"scores": case["scores"], "lengths": case["lengths"], "block_table": case["block_table"],
            "row_to_batch": case["row_to_batch"], "out": torch.empty(rows, topk, dtype=torch.int32), "topk": topk,
            "num_pages": None}


@pytest.mark.parametrize("change,message", [
    ({"num_pages": -1}, "num_pages must be an integer >= 0"),
    ({"num_pages": 2.5}, "num_pages must be an integer"),
    ({"scores": torch.zeros(3, 300, dtype=torch.float16)}, "scores must be float32 or bfloat16"),
    ({"block_table": torch.zeros(3, 5, dtype=torch.int64)}, "block_table must be int32"),
    ({"block_table": torch.zeros(3, 10, dtype=torch.int32)[:, ::2]}, "block_table rows must be contiguous"),
    ({"block_table": torch.zeros(1, 5, dtype=torch.int32).expand(3, 5)}, "block_table rows must not overlap"),
    ({"lengths": torch.zeros(2, dtype=torch.int32)}, r"lengths must be int32 \[3\]"),
    ({"row_to_batch": torch.zeros(3, dtype=torch.int64)}, r"row_to_batch must be int32 \[3\]"),
    ({"out": torch.empty(3, 65, dtype=torch.int32)}, r"out must be \[3, 64\]"),
    ({"out": torch.empty(3, 64, dtype=torch.int64)}, "out must be int32"),
    ({"row_to_batch": None, "block_table": torch.zeros(2, 5, dtype=torch.int32)}, "block_table has 2 rows for 3"),
    ({"topk": 0}, r"topk must be an integer in \[1, 2048\]"),
])
def test_check_inputs_names_the_argument(change, message):
    args = {**launcher_args(), **change}
    with pytest.raises(KernelInputError, match=message):
        check_inputs(**args)


def test_check_values_names_the_first_bad_position():
    case, num_pages = hostile_case(5000)
    out = torch.empty(6, TOPK, dtype=torch.int32)
    args = (case["scores"], case["lengths"], case["block_table"])
    with pytest.raises(KernelInputError, match=r"row_to_batch\[0, 4\] = 6 is outside \[0, 6\)"):
        check_inputs(*args, case["row_to_batch"], out, TOPK, num_pages, check=True)
    r2b = case["row_to_batch"].clone()
    r2b[4:] = 0
    with pytest.raises(KernelInputError, match=r"block_table\[0, 1\] = -7 is outside \[0, \d+\)"):
        check_inputs(*args, r2b, out, TOPK, num_pages, check=True)
    clean = case["block_table"].clamp(0, num_pages - 1)
    clean[2, -1] = -5  # past every row's pages: never read, not refused
    assert check_inputs(case["scores"], case["lengths"], clean, r2b, out, TOPK, num_pages, check=True) == num_pages
    assert check_inputs(case["scores"], case["lengths"], clean, r2b, out, TOPK, 2**40) == MAX_PAGES


def test_dsactl_check_env_turns_the_validation_on(monkeypatch):
    case, num_pages = hostile_case(5000)
    out = torch.empty(6, TOPK, dtype=torch.int32)
    args = (case["scores"], case["lengths"], case["block_table"], case["row_to_batch"], out, TOPK, num_pages)
    check_inputs(*args)
    monkeypatch.setenv("DSACTL_CHECK", "1")
    with pytest.raises(KernelInputError, match="row_to_batch"):
        check_inputs(*args)


@pytest.mark.parametrize("arch", ("sm90a", "sm100a"))
def test_kernel_compiles_without_spills(arch, tmp_path):
    import subprocess

    from dsactl.build import arch as arch_table
    from dsactl.build import ptxas
    from dsactl.build.cuda import PTXAS_REPORT_FLAGS
    from dsactl.kernels import cuda_library

    try:
        nvcc = cuda_library.find_nvcc()
    except KernelError as e:
        pytest.skip(str(e))
    (target,) = arch_table.resolve(arch)
    proc = subprocess.run([str(nvcc), *cuda_library.nvcc_flags(target.name), *PTXAS_REPORT_FLAGS,
                           "-o", str(tmp_path / "libtopk.so"), str(cuda_library.find("topk").path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kernels = ptxas.parse(proc.stdout + proc.stderr)
    names = " ".join(k.name for k in kernels)
    for kernel in ("topk_page_transform_kernel", "topk_row_kernel"):  # each for fp32 and bf16
        assert names.count(f"{kernel}INS_4Fp32E") >= 1 and names.count(f"{kernel}INS_4Bf16E") >= 1, names
    for k in kernels:
        assert (k.stack_frame, k.spill_stores, k.spill_loads) == (0, 0, 0), k


def test_launcher_rejects_topk_above_the_limit():
    case = make_case([10], torch.float32)
    out = torch.empty(1, 4096, dtype=torch.int32)
    with pytest.raises(KernelError, match=f"\\[1, {MAX_TOPK}\\]"):
        topk_page_transform(case["scores"], case["lengths"], case["block_table"], None, out, 4096)


def test_launcher_rejects_cpu_tensors():
    case = make_case([10], torch.float32)
    with pytest.raises(KernelError, match="CUDA tensor"):
        topk_page_transform(case["scores"], case["lengths"], case["block_table"], None,
                            torch.empty(1, 16, dtype=torch.int32), 16)


# ---------------------------------------------------------------------------------------------
# GPU: the kernel.

def run_kernel(case: dict, topk: int, row_to_batch="given") -> torch.Tensor:
    rows = case["scores"].shape[0]
    out = torch.full((rows, topk), INT_POISON, dtype=torch.int32, device=case["scores"].device)
    r2b = case["row_to_batch"] if row_to_batch == "given" else None
    topk_page_transform(case["scores"], case["lengths"], case["block_table"], r2b, out, topk)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_patterns_all_lengths(dtype, pattern):
    # 11 rows up to 1M: clusters of 8 CTAs, the 1M rows uncached (compaction or overflow).
    case = make_case(GPU_LENGTHS, dtype, pattern, rows_per_request=2, seed=3, device="cuda")
    ref = reference(case, TOPK)
    for repeat in range(3):
        assert_same_topk(run_kernel(case, TOPK), ref, case, TOPK, f"{pattern} call {repeat}")


@pytest.mark.gpu
@pytest.mark.parametrize("max_len", ROW_LENGTHS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_kernel_patterns(dtype, pattern, max_len):
    case = make_case(ROW_LENGTHS[max_len], dtype, pattern, rows_per_request=2, seed=max_len, device="cuda")
    ref = reference(case, TOPK)
    for repeat in range(3):
        assert_same_topk(run_kernel(case, TOPK), ref, case, TOPK, f"{pattern} call {repeat}")


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["random", "all_equal", "two_values", "fine_bin", "nan"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_kernel_gives_the_same_ids_in_the_same_order_every_call(dtype, pattern):
    """Rows the register-resident kernel serves: 1000 calls write identical ids in identical order, also
    where ties at the threshold leave the choice of ids open."""
    case = make_case([ROW_MAX_LEN, 6145, 4097, 2049, 3001, 5824], dtype, pattern, rows_per_request=2, seed=17,
                     device="cuda")
    first = run_kernel(case, TOPK)
    assert_same_topk(first, reference(case, TOPK), case, TOPK, pattern)
    for call in range(1000):
        assert torch.equal(run_kernel(case, TOPK), first), f"{pattern}: call {call} differs from the first"


def _random_length_batch(rows, max_len, dtype, pattern):
    """rows of random lengths in [1, max_len], the first exactly max_len, against the reference."""
    g = torch.Generator().manual_seed(rows)
    lengths = torch.randint(1, max_len + 1, (rows,), generator=g).tolist()
    lengths[0] = max_len
    case = make_case(lengths, dtype, pattern, seed=rows, device="cuda")
    assert_same_topk(run_kernel(case, TOPK), reference(case, TOPK), case, TOPK, f"{rows} rows")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", (1, 13, 128, 300))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", ("random", "two_values", "nan"))
def test_row_kernel_row_counts(rows, dtype, pattern):
    # Contest-like batches (lengths 1..5824, most rows selecting) and more rows than SMs.
    _random_length_batch(rows, 5824, dtype, pattern)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", (1, 7, 31, 128))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", ("random", "coarse_bin", "nan"))
def test_kernel_row_counts(rows, dtype, pattern):
    # Row counts pick the cluster size (8 down to 1); lengths mix structural, cached and
    # (at 128 rows x 131072, one CTA per row) uncached rows.
    _random_length_batch(rows, 131072, dtype, pattern)


@pytest.mark.gpu
@pytest.mark.parametrize("length", (131072, 1_048_576))
@pytest.mark.parametrize("pattern", ("random", "coarse_bin", "all_equal", "nan"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_single_long_row(dtype, pattern, length):
    # One row: the largest cluster (8 CTAs), cached at 131072, compacted or overflowing at 1M.
    case = make_case([length], dtype, pattern, seed=length % 1000, device="cuda")
    assert_same_topk(run_kernel(case, TOPK), reference(case, TOPK), case, TOPK)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_launch_plan(dtype):
    for rows in (1, 8, 32, 128):
        assert launch_plan(dtype, rows, 2049) == 0 and launch_plan(dtype, rows, ROW_MAX_LEN) == 0
    sizes = [launch_plan(dtype, rows, 131072) for rows in (1, 2, 8, 32, 64, 128, 1000)]
    assert all(s in (1, 2, 4, 8) for s in sizes) and sizes == sorted(sizes, reverse=True), sizes
    assert sizes[0] > 1 and sizes[-1] == 1, sizes  # one row spreads over a cluster; many rows, one CTA each
    assert launch_plan(dtype, 1, ROW_MAX_LEN + 1) == 1  # below 2 x kMinChunk a row stays on one CTA
    with pytest.raises(KernelError, match="dtype"):
        launch_plan(torch.float16, 1, 100)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", (1, 100, 512, 1024))
@pytest.mark.parametrize("longest", (70000, 5000))  # the cluster kernel, the row kernel
def test_kernel_other_k(topk, longest):
    case = make_case([1, topk, topk + 1, 3000, longest], torch.float32, "two_values", seed=topk, device="cuda")
    assert_same_topk(run_kernel(case, topk), reference(case, topk), case, topk)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("longest", (40000, 5000))  # the cluster kernel, the row kernel
def test_kernel_identity_row_to_batch_unaligned_and_strided_rows(dtype, longest):
    max_len, stride = longest + 3, longest + 11
    case = make_case([longest, 2049, 3000, 9], dtype, "random", seed=5, max_len=max_len, device="cuda")
    wide = torch.randn(4, stride, device="cuda").to(dtype)
    wide[:, 3:max_len + 3] = case["scores"]
    case["scores"] = wide[:, 3:max_len + 3]  # rows not 16-byte aligned: scalar loads
    case["row_to_batch"] = torch.arange(4, dtype=torch.int32, device="cuda")
    out = run_kernel(case, TOPK, row_to_batch=None)
    assert_same_topk(out, reference(case, TOPK), case, TOPK)


@pytest.mark.gpu
@pytest.mark.parametrize("longest", (131072, 5824))  # the cluster kernel, the row kernel
def test_kernel_is_cuda_graph_capturable(longest):
    lengths = [longest, 5824, 100]
    case = make_case(lengths, torch.float32, "random", seed=6, device="cuda")
    out = torch.full((3, TOPK), INT_POISON, dtype=torch.int32, device="cuda")
    args = (case["scores"], case["lengths"], case["block_table"], case["row_to_batch"], out, TOPK)
    topk_page_transform(*args)  # first call: the library configures the device
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_page_transform(*args)
    fresh = make_case(lengths, torch.float32, "coarse_bin", seed=7, device="cuda")
    for name in ("scores", "lengths", "block_table"):
        case[name].copy_(fresh[name])
    out.fill_(INT_POISON)
    graph.replay()
    assert_same_topk(out, reference(fresh, TOPK), fresh, TOPK)


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", (False, True))
def test_solution_entry_on_edge_workloads(bf16):
    from dsactl.harness import prepare, run
    from dsactl.workloads import suite

    name = "dsa_topk_page_transform_topk2048_ps64" + ("_bf16" if bf16 else "")
    workloads = [w for w in suite("edge") if w.definition == name]
    assert workloads
    for w in workloads:
        call = prepare(w, "cuda", seed=11)
        out = run(dsa_topk_page_transform, call)["topk_indices"]
        assert_same_topk(out, call.definition.run_reference(call.inputs)["topk_indices"], call.inputs, TOPK,
                         w.uuid)


@pytest.mark.gpu
def test_kernel_rejects_mismatched_shapes():
    case = make_case([100, 100], torch.float32, device="cuda")
    with pytest.raises(KernelError, match="out must be"):
        topk_page_transform(case["scores"], case["lengths"], case["block_table"], None,
                            torch.empty(2, 64, dtype=torch.int32, device="cuda"), TOPK)
    with pytest.raises(KernelError, match="lengths must be int32"):
        topk_page_transform(case["scores"], case["lengths"].long(), case["block_table"], None,
                            torch.empty(2, TOPK, dtype=torch.int32, device="cuda"), TOPK)


@pytest.mark.gpu
def test_check_refuses_row_to_batch_past_the_block_table():
    case = make_case([300, 5000], torch.float32, rows_per_request=1, seed=5, device="cuda")
    case["row_to_batch"][1] = case["block_table"].shape[0]
    out = torch.empty(2, TOPK, dtype=torch.int32, device="cuda")
    with pytest.raises(KernelError, match=r"row_to_batch\[0, 1\] = 2 is outside \[0, 2\)"):
        topk_page_transform(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"], out, TOPK,
                            check=True)


@pytest.mark.gpu
@pytest.mark.parametrize("max_len", (5000, 20000, 200_000))  # the row kernel, the cluster kernel (1, 8 CTAs)
def test_kernel_masks_bad_pages_and_batches_counts_them_and_stays_healthy(max_len):
    case, num_pages = hostile_case(max_len, "cuda")
    want, masked = topk_page_transform_model(*(case[n].cpu() for n in ("scores", "lengths", "block_table",
                                                                      "row_to_batch")), TOPK, num_pages=num_pages)
    reset_bad_index_count("cuda")
    for repeat in range(2):
        out = torch.full((6, TOPK), INT_POISON, dtype=torch.int32, device="cuda")
        topk_page_transform(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"], out, TOPK,
                            num_pages=num_pages)
        assert_same_ids(out, want)
    assert bad_index_count("cuda") == 2 * masked > 0
    # The context survives: a clean call right after is exact.
    clean = make_case([max_len, 3000], torch.float32, "random", seed=8, device="cuda")
    assert_same_topk(run_kernel(clean, TOPK), reference(clean, TOPK), clean, TOPK)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_kernel_masks_rows_of_an_empty_block_table():
    case = make_case([100, 3000], torch.float32, seed=9, device="cuda")
    out = torch.full((2, TOPK), INT_POISON, dtype=torch.int32, device="cuda")
    reset_bad_index_count("cuda")
    topk_page_transform(case["scores"], case["lengths"], torch.empty(0, 47, dtype=torch.int32, device="cuda"),
                        case["row_to_batch"], out, TOPK)
    assert (out == -1).all() and bad_index_count("cuda") == 100 + 2048


@pytest.mark.gpu
def test_check_refuses_a_page_outside_the_cache():
    case, num_pages = hostile_case(5000, "cuda")
    case["row_to_batch"][4:] = 0
    out = torch.full((6, TOPK), INT_POISON, dtype=torch.int32, device="cuda")
    with pytest.raises(KernelInputError, match=r"block_table\[0, 1\] = -7 is outside"):
        topk_page_transform(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"], out, TOPK,
                            num_pages=num_pages, check=True)
    assert (out == INT_POISON).all()  # refused before any launch
