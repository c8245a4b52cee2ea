"""Lightning indexer: scoring kernel, passthrough mapping, the complete solution, the torch baseline.

Without a GPU the Triton kernels run under the interpreter (tests/conftest.py sets
TRITON_INTERPRET before any kernel module is imported).
"""

import dataclasses

import pytest
import torch

from dsactl.definitions import get
from dsactl.kernels.errors import KernelError
from dsactl.fp8 import PAGE_SIZE, dequantize_index_k
from dsactl.harness import INT_POISON
from dsactl.kernels.indexer.passthrough import passthrough
from dsactl.kernels.indexer.score import (H200_SMS, LARGE_KEYS, LARGE_PROGRAMS_PER_SM, PROGRAMS_PER_SM,
                                          bad_index_count, choose_config, reset_bad_index_count, score)
from dsactl.kernels.indexer import solution
from dsactl.kernels.indexer.solution import dsa_topk_indexer
from dsactl.kernels.indexer.torch_baseline import dsa_topk_indexer_torch
from dsactl.kernels.topk import torch_baseline as topk_torch
from dsactl.workloads import Workload, make_inputs, suite

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = RTOL = 1e-2  # the contest's rule (docs/design.md, Contracts)


def indexer_name(heads=64, topk=2048, next_n=1):
    return f"dsa_topk_indexer_fp8_h{heads}_d128_topk{topk}_ps64" + (f"_nextn{next_n}" if next_n > 1 else "")


def make_case(seq_lens, heads=64, topk=2048, next_n=1, extra_pages=1, table_pad=None, seed=0, device=DEVICE):
    """Inputs of a generated workload: shuffled pages, random bytes in unreferenced pages."""
    max_pages = max((s + PAGE_SIZE - 1) // PAGE_SIZE for s in seq_lens) + extra_pages
    num_pages = sum((s + PAGE_SIZE - 1) // PAGE_SIZE for s in seq_lens) + 8
    params = {"seq_lens": tuple(seq_lens)}
    if table_pad is not None:
        params["table_pad"] = table_pad
    w = Workload("test", indexer_name(heads, topk, next_n), "test", "test",
                 {"batch_size": len(seq_lens), "num_pages": num_pages, "max_num_pages": max_pages}, params)
    return make_inputs(w, device, seed)


def reference_scores(inputs, next_n):
    """float32 scores per row over its visible tokens: {row: [visible]}."""
    q, cache, w = inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"]
    batch, heads = q.shape[0], q.shape[-2]
    q = q.float().reshape(batch, next_n, heads, 128)
    w = w.reshape(batch, next_n, heads)
    keys = dequantize_index_k(cache)
    out = {}
    for b in range(batch):
        seq_len = int(inputs["seq_lens"][b])
        pages = inputs["block_table"][b, : (seq_len + PAGE_SIZE - 1) // PAGE_SIZE].long()
        k = keys[pages].reshape(-1, 128)[:seq_len]
        for j in range(next_n):
            visible = max(seq_len - next_n + j + 1, 0)
            out[b * next_n + j] = (torch.relu(q[b, j] @ k[:visible].T) * w[b, j][:, None]).sum(0)
    return out


def physical_ids(block_table, b, visible):
    pos = torch.arange(visible, device=block_table.device)
    return block_table[b, pos // PAGE_SIZE].long() * PAGE_SIZE + pos % PAGE_SIZE


def assert_indexer_output(out, inputs, topk, next_n):
    """The contest's order-insensitive rule: per row, min(topk, visible) distinct ids of the
    row's visible tokens then -1s; the reference scores at the chosen ids, sorted, match the
    reference's sorted top scores (ties may pick other ids)."""
    scores = reference_scores(inputs, next_n)
    out = out.reshape(-1, topk)
    for r, row_scores in scores.items():
        visible = row_scores.numel()
        n = min(topk, visible)
        row = out[r]
        assert (row[n:] == -1).all(), f"row {r}: padding is not -1"
        chosen = row[:n].long()
        phys = physical_ids(inputs["block_table"], r // next_n, visible)
        order = phys.argsort()
        where = torch.searchsorted(phys[order], chosen).clamp_max(max(visible - 1, 0))
        assert visible == 0 or (phys[order][where] == chosen).all(), f"row {r}: id outside the row's visible tokens"
        assert chosen.unique().numel() == n, f"row {r}: duplicate ids"
        got = row_scores[order[where]].sort(descending=True).values
        want = row_scores.topk(n).values
        err = (got - want).abs()
        assert not ((err > ATOL) & (err / (want.abs() + 1e-8) > RTOL)).any(), \
            f"row {r}: selected scores differ from the top-{n} by up to {err.max().item():.3g}"


def run_solution(fn, inputs, topk, next_n):
    shape = (inputs["q_index_fp8"].shape[0],) + ((next_n,) if next_n > 1 else ()) + (topk,)
    out = torch.full(shape, INT_POISON, dtype=torch.int32, device=inputs["q_index_fp8"].device)
    fn(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"],
       inputs["block_table"], out)
    return out


# --- scoring kernel -----------------------------------------------------------------------

SCORE_CONFIGS = {  # (block_n, steps per program, large pipeline): one- and two-page steps
    "128x1": (128, 1, False),
    "64x2": (64, 2, False),  # two steps per program: the pipelined loop runs
    "64x3-large": (64, 3, True),
    "128-chosen": (128, None, None),
}


def score_config(name, batch, next_n, heads, width):
    block_n, steps, large = SCORE_CONFIGS[name]
    cfg = choose_config(batch, next_n, heads, width, block_n=block_n, large=large)
    if steps is not None:
        tokens = steps * cfg.block_n
        cfg = dataclasses.replace(cfg, tokens_per_program=tokens, splits=-(-width // tokens))
    return cfg


@pytest.mark.parametrize("heads,next_n,seq_lens", [
    (64, 1, [1, 64, 65, 300]),  # one token, exactly one page, one past a page, several pages
    (32, 3, [2, 130, 256]),  # a row seeing no token (seq_len < next_n), an exact 4-page row
    (64, 4, [129, 4]),
])
@pytest.mark.parametrize("config", list(SCORE_CONFIGS))
def test_scores_match_float32_reference(heads, next_n, seq_lens, config):
    inputs = make_case(seq_lens, heads=heads, next_n=next_n, extra_pages=2, table_pad=-1, seed=len(seq_lens))
    rows, width = len(seq_lens) * next_n, inputs["block_table"].shape[1] * PAGE_SIZE
    scores = torch.full((rows, width), float("nan"), device=DEVICE)
    lengths = torch.full((rows,), INT_POISON, dtype=torch.int32, device=DEVICE)
    score(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"],
          inputs["block_table"], scores, lengths, config=score_config(config, len(seq_lens), next_n, heads, width))
    for r, want in reference_scores(inputs, next_n).items():
        seq_len, visible = seq_lens[r // next_n], want.numel()
        assert lengths[r].item() == visible
        torch.testing.assert_close(scores[r, :visible], want, rtol=1e-4, atol=1e-3)
        assert (scores[r, visible:seq_len] == float("-inf")).all(), "causally hidden positions must be -inf"
        assert scores[r, seq_len:].isnan().all(), "nothing may be written past seq_len"


@pytest.mark.parametrize("large", [False, True])
def test_requests_that_fit_are_not_scored(large):
    inputs = make_case([100, 700], heads=64, extra_pages=0, seed=3)
    width = inputs["block_table"].shape[1] * PAGE_SIZE
    scores = torch.full((2, width), float("nan"), device=DEVICE)
    lengths = torch.full((2,), INT_POISON, dtype=torch.int32, device=DEVICE)
    score(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"],
          inputs["block_table"], scores, lengths, skip_len=512, config=choose_config(2, 1, 64, width, large=large))
    assert lengths.tolist() == [100, 700]
    assert scores[0].isnan().all()
    assert not scores[1, :700].isnan().any()


def test_score_rejects_malformed_inputs():
    inputs = make_case([70], heads=64)
    scores = torch.empty(1, inputs["block_table"].shape[1] * PAGE_SIZE, device=DEVICE)
    lengths = torch.empty(1, dtype=torch.int32, device=DEVICE)
    args = [inputs[n] for n in ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")]
    with pytest.raises(KernelError, match="float8_e4m3fn"):
        score(args[0].float(), *args[1:], scores, lengths)
    with pytest.raises(KernelError, match="heads"):
        score(args[0][:, :16].contiguous(), *args[1:], scores, lengths)
    with pytest.raises(KernelError, match="scores"):
        score(*args, scores[:, :64], lengths)
    cfg = choose_config(1, 1, 64, scores.shape[1])
    with pytest.raises(KernelError, match="does not tile"):
        score(*args, scores, lengths, config=dataclasses.replace(cfg, splits=0))


@pytest.mark.parametrize("batch,max_len", [(1, 4096), (1, 131072), (8, 32768), (64, 131072), (128, 131072),
                                           (31, 5824), (300, 8192)])
def test_split_covers_rows_and_fills_the_gpu(batch, max_len):
    cfg = choose_config(batch, 1, 64, max_len)
    assert cfg.tokens_per_program % cfg.block_n == 0
    assert cfg.splits * cfg.tokens_per_program >= max_len > (cfg.splits - 1) * cfg.tokens_per_program
    programs = batch * cfg.splits
    steps = -(-max_len // cfg.block_n)
    per_sm = LARGE_PROGRAMS_PER_SM if batch * max_len >= LARGE_KEYS else PROGRAMS_PER_SM
    assert programs >= min(H200_SMS, batch * steps), "small batches of long rows must fill the SMs"
    assert cfg.splits == 1 or programs <= per_sm * H200_SMS, "no second partial wave"


def test_large_calls_take_the_deeper_pipeline():
    short, large = choose_config(13, 1, 64, 2752), choose_config(64, 1, 64, 131072)  # contest-indexer-100, 64 x 128K
    assert large.num_stages > short.num_stages
    assert short.tokens_per_program == short.block_n, "short rows: one step per program"
    assert choose_config(8, 1, 64, 32768).num_stages == short.num_stages  # measured slower with the deep pipeline


# --- passthrough ----------------------------------------------------------------------------

@pytest.mark.parametrize("next_n,topk", [(1, 2048), (3, 512)])
def test_passthrough_is_the_page_mapping(next_n, topk):
    seq_lens = [1, 63, 64, 65, 200] if topk == 512 else [1, 64, 2047, 2048, 1000]
    max_pages = topk // PAGE_SIZE
    batch = len(seq_lens)
    table = torch.randperm(batch * max_pages, device=DEVICE).to(torch.int32).view(batch, max_pages)
    for b, s in enumerate(seq_lens):
        table[b, (s + PAGE_SIZE - 1) // PAGE_SIZE:] = -1  # unused slots are never dereferenced
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    out = torch.full((batch * next_n, topk), INT_POISON, dtype=torch.int32, device=DEVICE)
    passthrough(lens, table, out, next_n, batch * max_pages)
    for r in range(batch * next_n):
        visible = max(seq_lens[r // next_n] - next_n + r % next_n + 1, 0)
        assert torch.equal(out[r, :visible].long(), physical_ids(table, r // next_n, visible))
        assert (out[r, visible:] == -1).all()


def test_passthrough_refuses_rows_longer_than_topk():
    table = torch.zeros(1, 9, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelError, match="max_num_pages"):
        passthrough(torch.ones(1, dtype=torch.int32, device=DEVICE), table,
                    torch.empty(1, 512, dtype=torch.int32, device=DEVICE), 1, 9)


def test_passthrough_refuses_a_block_table_that_is_not_int32_or_short_of_the_batch():
    lens, out = torch.ones(2, dtype=torch.int32, device=DEVICE), torch.empty(2, 512, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelError, match="block_table must be int32"):
        passthrough(lens, torch.zeros(2, 8, dtype=torch.int64, device=DEVICE), out, 1, 8)
    with pytest.raises(KernelError, match="block_table has 1 rows for a batch of 2"):
        passthrough(lens, torch.zeros(1, 8, dtype=torch.int32, device=DEVICE), out, 1, 8)


def test_passthrough_check_refuses_a_page_outside_the_cache_a_request_reads(monkeypatch):
    """DSACTL_CHECK=1 on the short-row path too: a page past the cache inside a request's seq_len is named;
    one past its seq_len is never read, so not refused."""
    monkeypatch.setenv("DSACTL_CHECK", "1")
    lens = torch.tensor([100, 30], dtype=torch.int32, device=DEVICE)
    table = torch.tensor([[0, 1, 2, 3], [4, 99, 5, 6]], dtype=torch.int32, device=DEVICE)
    out = torch.full((2, 256), INT_POISON, dtype=torch.int32, device=DEVICE)
    passthrough(lens, table, out, 1, 8)  # page 99 sits past request 1's 30 tokens
    assert (out[1, 30:] == -1).all()
    table[0, 1] = 8
    with pytest.raises(KernelError, match=r"block_table\[0, 1\] = 8 is outside \[0, 8\)"):
        passthrough(lens, table, out, 1, 8)


def plant_out_of_range_pages(table, seq_lens, num_pages):
    """A copy of table with page ids 5e7, -7 and num_pages (one past the cache) among the requests' pages
    (page 0 of each request beyond the first keeps its id, num_pages - 1 stays valid); how many."""
    bad = table.clone()
    planted = [50_000_000, -7, num_pages]
    spots = [(b, p) for b, s in enumerate(seq_lens) for p in range(1, (s + PAGE_SIZE - 1) // PAGE_SIZE)]
    assert len(spots) >= len(planted)
    for (b, p), page in zip(spots, planted):
        bad[b, p] = page
    return bad, len(planted)


def test_pages_outside_the_cache_score_minus_inf_unread_and_counted():
    seq_lens, next_n = [200, 300], 2
    inputs = make_case(seq_lens, heads=64, next_n=next_n, extra_pages=1, table_pad=-1, seed=11)
    num_pages = inputs["k_index_cache_fp8"].shape[0]
    table, planted = plant_out_of_range_pages(inputs["block_table"], seq_lens, num_pages)
    rows, width = len(seq_lens) * next_n, table.shape[1] * PAGE_SIZE
    scores = torch.full((rows, width), float("nan"), device=DEVICE)
    lengths = torch.full((rows,), INT_POISON, dtype=torch.int32, device=DEVICE)
    reset_bad_index_count(DEVICE)
    score(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"], table, scores,
          lengths)
    assert bad_index_count(DEVICE) == planted
    for r, want in reference_scores(inputs, next_n).items():
        b, visible = r // next_n, want.numel()
        pages = table[b, torch.arange(visible, device=DEVICE) // PAGE_SIZE]
        in_cache = (pages >= 0) & (pages < num_pages)
        torch.testing.assert_close(scores[r, :visible][in_cache], want[in_cache], rtol=1e-4, atol=1e-3)
        assert (scores[r, :visible][~in_cache] == float("-inf")).all()


def test_seq_lens_past_the_pages_score_only_the_pages():
    seq_lens = [200, 120]
    inputs = make_case(seq_lens, heads=32, extra_pages=0, seed=12)
    table = inputs["block_table"][:, :2].contiguous()  # 128 tokens of pages for seq_lens of 200 and 120
    scores = torch.full((2, 192), float("nan"), device=DEVICE)  # wider than the pages: the rest stays NaN
    lengths = torch.full((2,), INT_POISON, dtype=torch.int32, device=DEVICE)
    reset_bad_index_count(DEVICE)
    score(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"], table,
          scores, lengths)
    assert lengths.tolist() == seq_lens and bad_index_count(DEVICE) == 0
    assert torch.isfinite(scores[0, :128]).all() and torch.isfinite(scores[1, :120]).all()
    assert scores[0, 128:].isnan().all() and scores[1, 120:].isnan().all()


def test_passthrough_translates_pages_outside_the_cache_to_minus_one():
    seq_lens, next_n, max_pages, num_pages = [130, 200], 2, 8, 16
    table = torch.randperm(num_pages, device=DEVICE)[: 2 * max_pages].to(torch.int32).view(2, max_pages)
    bad, planted = plant_out_of_range_pages(table, seq_lens, num_pages)
    bad[0, 7] = 50_000_000  # past the request's pages: not read as a page, not counted
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    out = torch.full((2 * next_n, 512), INT_POISON, dtype=torch.int32, device=DEVICE)
    reset_bad_index_count(DEVICE)
    passthrough(lens, bad, out, next_n, num_pages)
    assert bad_index_count(DEVICE) == planted
    for r in range(2 * next_n):
        visible = seq_lens[r // next_n] - next_n + r % next_n + 1
        pages = bad[r // next_n, torch.arange(visible, device=DEVICE) // PAGE_SIZE]
        want = torch.where((pages >= 0) & (pages < num_pages), physical_ids(bad, r // next_n, visible), -1)
        assert torch.equal(out[r, :visible].long(), want)
        assert (out[r, visible:] == -1).all()


# --- complete solution and baseline ---------------------------------------------------------

@pytest.mark.parametrize("heads,topk,next_n,seq_lens", [
    (64, 512, 1, [700, 300, 1000, 1]),  # scored rows, a request that fits (not scored), length 1
    (32, 512, 2, [513, 640, 2]),  # next_n: row 0 of request 0 sees exactly topk tokens
    (64, 1024, 1, [1000, 1]),  # every row fits: passthrough
])
@pytest.mark.parametrize("fn", [dsa_topk_indexer, dsa_topk_indexer_torch], ids=["solution", "torch"])
def test_solution_matches_reference(fn, heads, topk, next_n, seq_lens, monkeypatch):
    if DEVICE == "cpu":
        # The CUDA top-k cannot run here: the top-k stage is its torch baseline (same contract),
        # so this checks scoring, passthrough and how the solution composes the stages.
        monkeypatch.setattr(solution, "topk_page_transform",
                            lambda scores, lengths, table, r2b, out, k, num_pages: topk_torch.topk_page_transform(
                                scores, lengths, table, r2b, out, num_pages=num_pages))
    inputs = make_case(seq_lens, heads=heads, topk=topk, next_n=next_n, table_pad=-1, seed=topk + next_n)
    out = run_solution(fn, inputs, topk, next_n)
    assert_indexer_output(out, inputs, topk, next_n)


def test_solution_gives_minus_one_for_pages_outside_the_cache(monkeypatch):
    if DEVICE == "cpu":  # the top-k stage is its torch baseline, as above
        monkeypatch.setattr(solution, "topk_page_transform",
                            lambda scores, lengths, table, r2b, out, k, num_pages: topk_torch.topk_page_transform(
                                scores, lengths, table, r2b, out, num_pages=num_pages))
    # Request 0 is scored: 408 of its tokens are on pages in the cache, so the top-k also selects bad ones
    # (they score -inf) and writes them as -1; request 1 fits in topk and is mapped structurally.
    seq_lens, topk = [600, 200], 512
    inputs = make_case(seq_lens, topk=topk, table_pad=-1, seed=13)
    num_pages = inputs["k_index_cache_fp8"].shape[0]
    inputs["block_table"], _ = plant_out_of_range_pages(inputs["block_table"], seq_lens, num_pages)
    out = run_solution(dsa_topk_indexer, inputs, topk, 1)
    for b, visible in enumerate(seq_lens):
        pages = inputs["block_table"][b, torch.arange(visible, device=DEVICE) // PAGE_SIZE]
        in_cache = (pages >= 0) & (pages < num_pages)
        valid = physical_ids(inputs["block_table"], b, visible)[in_cache]
        chosen = out[b][out[b] != -1].long()
        assert chosen.numel() == min(topk, valid.numel()) == chosen.unique().numel(), f"request {b}"
        assert torch.isin(chosen, valid).all(), f"request {b}: an id off the row's pages in the cache"


def test_row_to_batch_maps_rows_to_requests_and_keeps_what_it_handed_out():
    device = torch.device("cpu")
    first = solution._row_to_batch(device, 5, 3)
    for rows in (1, 5, 6, 70, 9):
        got = solution._row_to_batch(device, rows, 3)
        assert torch.equal(got, torch.arange(rows, dtype=torch.int32) // 3)
    # A CUDA graph may still read the first tensor: growing the cache must not free it.
    assert any(t.data_ptr() == first.data_ptr() for t in solution._ROW_TO_BATCH[(device, 3)])


def test_order_insensitive_check_catches_wrong_selection():
    """The checker itself: the reference passes, a row with one non-top id fails."""
    inputs = make_case([900], heads=64, topk=512, seed=5)
    d = get(indexer_name(64, 512))
    ref = d.run_reference(inputs)["topk_indices"]
    assert_indexer_output(ref, inputs, 512, 1)
    scores = reference_scores(inputs, 1)[0]
    worst = scores.argmin()
    bad = ref.clone()
    bad[0, 0] = physical_ids(inputs["block_table"], 0, 900)[worst]
    with pytest.raises(AssertionError):
        assert_indexer_output(bad, inputs, 512, 1)


# --- GPU: suites against the reference ------------------------------------------------------

def _suite_ids(name, prefix):
    return [w for w in suite(name) if w.uuid.startswith(prefix)]


@pytest.mark.gpu
@pytest.mark.parametrize("workload", _suite_ids("contest", "contest-indexer") + _suite_ids("edge", "edge-indexer")
                         + [w for w in _suite_ids("scale", "scale-indexer") if w.axes["batch_size"] <= 8],
                         ids=lambda w: w.uuid)
def test_suites_on_gpu(workload):
    d = get(workload.definition)
    inputs = make_inputs(workload, "cuda", seed=1)
    topk, next_n = d.params["topk"], d.params["next_n"]
    assert_indexer_output(run_solution(dsa_topk_indexer, inputs, topk, next_n), inputs, topk, next_n)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,topk,next_n,seq_lens", [
    (64, 2048, 2, [2048, 2049, 2050, 4096, 1]),  # rows at, one past and two past topk; page boundaries
    (64, 2048, 3, [131072, 70000, 3]),
    (64, 2048, 4, [32768, 5000, 4, 2052]),
    (32, 1024, 1, [65536, 1024, 1025, 640]),
    (32, 512, 4, [40000, 515, 516, 64]),
    (64, 512, 1, [131072] * 3 + [1]),
])
def test_long_and_mtp_rows_on_gpu(heads, topk, next_n, seq_lens):
    inputs = make_case(seq_lens, heads=heads, topk=topk, next_n=next_n, table_pad=-1, seed=7, device="cuda")
    out = run_solution(dsa_topk_indexer, inputs, topk, next_n)
    assert_indexer_output(out, inputs, topk, next_n)


@pytest.mark.gpu
def test_calls_on_concurrent_streams_keep_their_own_scores(hold_back):
    """Scored calls on two streams at once each get their own score scratch. Each call's top-k is held
    back on its stream, so the other stream's scoring kernel runs in between: scores shared between
    the calls would hand one call's top-k the other's."""
    hold_back(solution, "topk_page_transform")
    streams = [torch.cuda.Stream() for _ in range(2)]
    cases = [make_case([40000, 9000, 70000, 2500], seed=30 + k, device="cuda") for k in range(2)]
    outs = [torch.full((4, 2048), INT_POISON, dtype=torch.int32, device="cuda") for _ in cases]
    torch.cuda.synchronize()
    for _ in range(3):
        for stream, inputs, out in zip(streams, cases, outs):
            with torch.cuda.stream(stream):
                dsa_topk_indexer(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"],
                                 inputs["seq_lens"], inputs["block_table"], out)
    torch.cuda.synchronize()
    for inputs, out in zip(cases, outs):
        assert_indexer_output(out, inputs, 2048, 1)
