"""The dsactl custom ops (kernels/ops.py) and DecodeStep (kernels/step.py).

On a CPU: the ops' schemas, their fake implementations under FakeTensorMode and make_fx, torch.compile
(fullgraph=True) over them, and DecodeStep's checks and a whole step against the definitions' chained
references. What runs for real here is the Triton code under the interpreter: the indexer's passthrough
and scoring kernels and the Triton attention; the CUDA top-k is replaced by its torch baseline (same
contract) where a row needs scoring. On a GPU (tests marked gpu): the step against the references over
batch x heads x KV format, replayed from a CUDA graph on new inputs, and a compiled function of the ops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import timeit
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import dsactl.ops
from dsactl.definitions import get
from dsactl.fp8 import quantize_mla_kv
from dsactl.harness import INT_POISON
from dsactl.kernels import ops
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.indexer import solution as indexer_solution
from dsactl.kernels.step import DecodeStep
from dsactl.kernels.topk import torch_baseline as topk_torch
from dsactl.verify.rules import check
from dsactl.workloads.step_inputs import INDEX_NAMES, MLA_NAMES, SM_SCALE, caches, call_step, step_inputs

ROOT = Path(__file__).resolve().parents[1]
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# A step small enough for the interpreter (seconds): every row fits in topk, so the indexer maps
# rows structurally and the attention gathers up to 512 ids a token.
TINY = dict(batch=2, max_context=512, heads=16, next_n=2, topk=512, index_heads=32)
# The same with rows longer than topk: the indexer scores them.
TINY_SCORED = {**TINY, "max_context": 640}


def poison_workspace(step: DecodeStep) -> None:
    step.topk_indices.fill_(INT_POISON)
    step.output.fill_(float("nan"))
    step.lse.fill_(float("nan"))


def indexer_definition(step: DecodeStep):
    return get(f"dsa_topk_indexer_fp8_h{step.index_heads}_d128_topk{step.topk}_ps64"
               + (f"_nextn{step.next_n}" if step.next_n > 1 else ""))


def attention_definition(step: DecodeStep):
    return get(f"dsa_sparse_attention_h{step.heads}_ckv512_kpe64_topk{step.topk}_ps64"
               + ("_fp8kv" if step.kv_format == "fp8" else "") + ("_lsee" if step.lse_base_e else ""))


def assert_matches_chained_references(step: DecodeStep, inputs: dict, output: torch.Tensor,
                                      lse: torch.Tensor) -> None:
    """The ids pass the indexer definition's rule (sets; ties may pick other ids) and the output and lse
    match the attention definition's reference over the indexer reference's ids; where ties made the
    ids differ, over the step's own ids."""
    indexer, attention = indexer_definition(step), attention_definition(step)
    index_inputs = {k: inputs[k] for k in INDEX_NAMES}
    ids = step.topk_indices.reshape(indexer.output_shapes(indexer.check_inputs(index_inputs))["topk_indices"])
    verdict = check(indexer, index_inputs, {"topk_indices": ids})
    assert verdict.passed, "\n".join(verdict.problems)
    reference_ids = indexer.run_reference(index_inputs)["topk_indices"].reshape(step.num_tokens, step.topk)
    step_ids = step.topk_indices.view_as(reference_ids)
    same_sets = torch.equal(reference_ids.sort(dim=1).values, step_ids.sort(dim=1).values)
    attention_inputs = {k: v for k, v in inputs.items() if k in attention.input_names}
    attention_inputs["sparse_indices"] = reference_ids if same_sets else step_ids
    verdict = check(attention, attention_inputs, {"output": output, "lse": lse})
    assert verdict.passed, "\n".join(verdict.problems)


def torch_topk(scores, lengths, table, row_to_batch, out, topk, num_pages):
    """The CUDA top-k's contract on any device (its torch baseline)."""
    topk_torch.topk_page_transform(scores, lengths, table, row_to_batch, out, num_pages=num_pages)


# ------------------------------------------------------------------ registration

SCHEMAS = {
    "indexer_topk": "dsactl::indexer_topk(Tensor q_index_fp8, Tensor k_index_cache_fp8, Tensor weights, "
                    "Tensor seq_lens, Tensor block_table, SymInt topk) -> Tensor",
    "indexer_topk_out": "dsactl::indexer_topk_out(Tensor q_index_fp8, Tensor k_index_cache_fp8, Tensor weights, "
                        "Tensor seq_lens, Tensor block_table, Tensor(a5!) topk_indices) -> ()",
    "prefill_topk": "dsactl::prefill_topk(Tensor q_index_fp8, Tensor k_index_fp8, Tensor k_index_scale, "
                    "Tensor weights, Tensor ks, Tensor ke, SymInt topk, SymInt? max_row_keys=None, "
                    "int logits_bytes=1073741824) -> Tensor",
    "prefill_topk_out": "dsactl::prefill_topk_out(Tensor q_index_fp8, Tensor k_index_fp8, Tensor k_index_scale, "
                        "Tensor weights, Tensor ks, Tensor ke, Tensor(a6!) topk_indices, SymInt? max_row_keys=None, "
                        "int logits_bytes=1073741824) -> ()",
    "sparse_mla_decode": "dsactl::sparse_mla_decode(Tensor q_nope, Tensor q_pe, Tensor sparse_indices, "
                         "float sm_scale, Tensor? kv_cache=None, Tensor? ckv_cache=None, Tensor? kpe_cache=None, "
                         "Tensor? topk_length=None, Tensor? attn_sink=None, bool lse_base_e=False) -> (Tensor, Tensor)",
    "sparse_mla_decode_out": "dsactl::sparse_mla_decode_out(Tensor q_nope, Tensor q_pe, Tensor sparse_indices, "
                             "float sm_scale, Tensor(a4!) output, Tensor(a5!) lse, Tensor? kv_cache=None, "
                             "Tensor? ckv_cache=None, Tensor? kpe_cache=None, Tensor? topk_length=None, "
                             "Tensor? attn_sink=None, bool lse_base_e=False) -> ()",
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_ops_are_registered_with_their_schemas(name):
    assert name in ops.OPS
    assert str(getattr(torch.ops.dsactl, name).default._schema) == SCHEMAS[name]


def test_registration_is_idempotent_and_loads_no_cuda_library():
    """Imported under a second package name (a copy of kernels/ in a bundle) and reloaded, the module
    finds the ops defined; importing it loads none of the CUDA libraries."""
    script = ("import importlib, sys, torch\n"
              "import dsactl.kernels.ops as first\n"
              "from dsactl.kernels.attention import hopper_mla, mma_mla\n"
              "from dsactl.kernels.topk import launcher\n"
              "assert all(f.cache_info().currsize == 0 for f in (hopper_mla.library, mma_mla.library, "
              "launcher._library))\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "second = importlib.import_module('kernels.ops')\n"
              "importlib.reload(first)\n"
              "assert second is not first and second.indexer_topk is torch.ops.dsactl.indexer_topk\n")
    r = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr


def _in_aten_calls(fn, number: int) -> float:
    """The host time of a call of fn, in calls of an in-place aten op on a one-element tensor (the best of 5
    rounds of `number` calls each): a measure of Python overhead that holds across machines."""
    t = torch.randn(1, generator=torch.Generator().manual_seed(4))
    aten = min(timeit.repeat(lambda: torch.ops.aten.zero_(t), number=number, repeat=5))
    return min(timeit.repeat(fn, number=number, repeat=5)) / aten


def test_an_op_call_costs_the_host_little_beyond_its_launcher(monkeypatch):
    """An eager step makes two op calls: the dispatcher's way to a launcher (stubbed out here) costs the host
    less than ten in-place aten calls, a bound torch.library.custom_op's wrappers exceed several times over."""
    monkeypatch.setattr(ops, "sparse_mla_attention", lambda *args, **kwargs: None)
    t = [torch.randn(1, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    op = _in_aten_calls(lambda: ops.sparse_mla_decode_out(t[0], t[1], t[2], 0.5, t[3], t[4], kv_cache=t[5]), 2000)
    assert op < 10, f"an op call costs {op:.1f} aten calls"


class _NoLaunch:
    """A Triton kernel whose launches do nothing: what is left of a call is its host-side Python."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def test_an_eager_step_costs_the_host_little_beyond_its_launches(monkeypatch):
    """An engine that runs the step eagerly pays its Python every call: with every launch stubbed out (the
    scoring, top-k, attention and combine kernels), a scored 16-head FP8 step costs the host less than 150
    in-place aten calls, a bound that torch.library.custom_op's wrappers, or checks that format their messages
    before they fail, exceed."""
    from dsactl.kernels.attention import triton_sparse_mla as tsm
    from dsactl.kernels.indexer import score

    for module, name in [(tsm, "_sparse_mla_fp8_kernel"), (tsm, "_sparse_mla_fp8_f16_kernel"),
                         (tsm, "_sparse_mla_bf16_kernel"), (tsm, "_sparse_mla_combine_kernel"),
                         (score, "indexer_score_kernel")]:
        monkeypatch.setattr(module, name, _NoLaunch())
    monkeypatch.setattr(indexer_solution, "topk_page_transform", lambda *args, **kwargs: None)
    step = DecodeStep(batch=1, max_context=4096, heads=16, kv_format="fp8", device="cpu")
    inputs = step_inputs(step, seed=3)
    call_step(step, inputs)
    eager = _in_aten_calls(lambda: call_step(step, inputs), 200)
    assert eager < 150, f"an eager step costs {eager:.0f} aten calls"


def test_importing_dsactl_ops_registers_the_ops_and_dsactl_alone_imports_no_torch():
    """An engine's one import: in a fresh process, `import dsactl.ops` makes torch.ops.dsactl.* resolve
    (no GPU needed) and gives their handles; `import dsactl` alone leaves torch out (the CLI's start-up)."""
    alone = subprocess.run([sys.executable, "-c", "import sys, dsactl; print('torch' in sys.modules)"],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert alone.stdout.strip() == "False", alone.stderr
    script = ("import dsactl.ops, torch\n"
              "for name in ('indexer_topk', 'indexer_topk_out', 'sparse_mla_decode', 'sparse_mla_decode_out'):\n"
              "    assert getattr(dsactl.ops, name) is getattr(torch.ops.dsactl, name), name\n"
              "print(torch.ops.dsactl.indexer_topk.default._schema.name, "
              "torch.ops.dsactl.sparse_mla_decode.default._schema.name)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["dsactl::indexer_topk", "dsactl::sparse_mla_decode"]
    assert dsactl.ops.DecodeStep is DecodeStep and dsactl.ops.KernelInputError is KernelInputError


# ------------------------------------------------------------------ fake implementations

def _fake_inputs(mode: FakeTensorMode, batch=3, next_n=2, index_heads=64, tokens=6, heads=128, topk=2048,
                 pages=40, max_pages=30):
    with mode:
        mtp = (next_n,) if next_n > 1 else ()
        return {
            "q_index_fp8": torch.empty(batch, *mtp, index_heads, 128, dtype=torch.float8_e4m3fn),
            "k_index_cache_fp8": torch.empty(pages, 64, 1, 132, dtype=torch.int8),
            "weights": torch.empty(batch, *mtp, index_heads),
            "seq_lens": torch.empty(batch, dtype=torch.int32),
            "block_table": torch.empty(batch, max_pages, dtype=torch.int32),
            "q_nope": torch.empty(tokens, heads, 512, dtype=torch.bfloat16),
            "q_pe": torch.empty(tokens, heads, 64, dtype=torch.bfloat16),
            "sparse_indices": torch.empty(tokens, topk, dtype=torch.int32),
            "kv_cache": torch.empty(pages, 64, 656, dtype=torch.int8),
        }


@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_fake_indexer_topk_gives_the_output_shape(next_n):
    mode = FakeTensorMode()
    t = _fake_inputs(mode, next_n=next_n)
    with mode:
        out = ops.indexer_topk(*(t[k] for k in INDEX_NAMES), 1024)
        assert ops.indexer_topk_out(*(t[k] for k in INDEX_NAMES), torch.empty(out.shape, dtype=torch.int32)) is None
    assert out.shape == ((3, 1024) if next_n == 1 else (3, next_n, 1024))
    assert out.dtype == torch.int32 and out.device == t["q_index_fp8"].device


@pytest.mark.parametrize("heads", [16, 128])
def test_fake_sparse_mla_decode_gives_output_and_lse_shapes(heads):
    mode = FakeTensorMode()
    t = _fake_inputs(mode, heads=heads)
    with mode:
        output, lse = ops.sparse_mla_decode(t["q_nope"], t["q_pe"], t["sparse_indices"], SM_SCALE,
                                            kv_cache=t["kv_cache"], lse_base_e=True)
        assert ops.sparse_mla_decode_out(t["q_nope"], t["q_pe"], t["sparse_indices"], SM_SCALE, output, lse,
                                         kv_cache=t["kv_cache"]) is None
    assert (output.shape, output.dtype) == ((6, heads, 512), torch.bfloat16)
    assert (lse.shape, lse.dtype) == ((6, heads), torch.float32)


def test_fake_prefill_topk_gives_the_output_shape():
    with FakeTensorMode():
        q = torch.empty(7, 64, 128, dtype=torch.float8_e4m3fn)
        k, scale = torch.empty(300, 128, dtype=torch.float8_e4m3fn), torch.empty(300)
        weights, ks = torch.empty(7, 64), torch.empty(7, dtype=torch.int32)
        out = ops.prefill_topk(q, k, scale, weights, ks, ks, 512, max_row_keys=256)
        assert ops.prefill_topk_out(q, k, scale, weights, ks, ks, out) is None
    assert (out.shape, out.dtype) == ((7, 512), torch.int32)


def test_fake_indexer_topk_names_a_malformed_q():
    mode = FakeTensorMode()
    t = _fake_inputs(mode)
    with mode, pytest.raises(KernelInputError, match="indexer q must be"):
        ops.indexer_topk(torch.empty(2, 128, dtype=torch.float8_e4m3fn), *(t[k] for k in INDEX_NAMES[1:]), 512)


def decode(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, q_nope, q_pe, kv_cache, topk: int):
    """One decode step written with the functional ops, as a model would."""
    ids = ops.indexer_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk)
    return ops.sparse_mla_decode(q_nope, q_pe, ids.view(q_nope.shape[0], topk), SM_SCALE, kv_cache=kv_cache)


def dsactl_calls(gm) -> list[str]:
    """The dsactl ops a graph calls, in order, as namespace.name (an overload or its packet)."""
    names = [".".join(str(n.target).split(".")[:2]) for n in gm.graph.nodes if n.op == "call_function"]
    return [name for name in names if name.startswith(f"{ops.NAMESPACE}.")]


def test_make_fx_traces_a_long_row_step_on_fake_tensors_only():
    """Rows of 1920 keys for topk 512 would need the CUDA top-k: the trace runs the fake implementations
    alone, and the graph calls each op once."""
    mode = FakeTensorMode()
    t = _fake_inputs(mode, batch=3, next_n=2, tokens=6, heads=64, topk=512)
    args = [t[k] for k in INDEX_NAMES] + [t["q_nope"], t["q_pe"], t["kv_cache"]]
    gm = make_fx(lambda *a: decode(*a, topk=512), tracing_mode="fake")(*args)
    assert dsactl_calls(gm) == ["dsactl.indexer_topk", "dsactl.sparse_mla_decode"]


# ------------------------------------------------------------------ torch.compile (interpreter on a CPU)

class RecordingBackend:
    """A torch.compile backend that keeps each FX graph and runs it as traced (no inductor)."""

    def __init__(self) -> None:
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def called(self) -> list[str]:
        return [name for gm in self.graphs for name in dsactl_calls(gm)]


@pytest.mark.skipif(not INTERPRETING and not GPU, reason="the Triton kernels need a GPU or TRITON_INTERPRET=1")
def test_compile_fullgraph_traces_the_ops_in_one_graph_and_matches_eager():
    torch._dynamo.reset()
    step = DecodeStep(**TINY, kv_format="fp8", device=DEVICE)
    inputs = step_inputs(step, seed=11)
    args = [inputs[k] for k in INDEX_NAMES] + [inputs["q_nope"], inputs["q_pe"], inputs["kv_cache"]]
    backend = RecordingBackend()
    compiled = torch.compile(lambda *a: decode(*a, topk=step.topk), backend=backend, fullgraph=True)
    output, lse = compiled(*args)
    assert len(backend.graphs) == 1
    assert backend.called() == ["dsactl.indexer_topk", "dsactl.sparse_mla_decode"]
    expected_output, expected_lse = decode(*args, topk=step.topk)
    assert torch.equal(output, expected_output) and torch.equal(lse, expected_lse)


@pytest.mark.skipif(not INTERPRETING and not GPU, reason="the Triton kernels need a GPU or TRITON_INTERPRET=1")
def test_compile_fullgraph_of_a_step_functionalizes_its_out_variants():
    """aot_eager functionalizes the step's in-place ops (one graph, its checks traced away) and writes
    their results back into the step's buffers, as the eager step does."""
    torch._dynamo.reset()
    step = DecodeStep(**TINY, kv_format="bf16", device=DEVICE)
    inputs = step_inputs(step, seed=12)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda i: call_step(step, i), backend=counter, fullgraph=True)
    poison_workspace(step)
    output, lse = compiled(inputs)
    assert counter.frame_count == 1 and output is step.output and lse is step.lse
    assert_matches_chained_references(step, inputs, output, lse)
    traced = (step.topk_indices.clone(), step.output.clone(), step.lse.clone())
    poison_workspace(step)
    call_step(step, inputs)
    assert all(torch.equal(a, b) for a, b in zip(traced, (step.topk_indices, step.output, step.lse)))


# ------------------------------------------------------------------ DecodeStep: configuration

@pytest.mark.parametrize("change,named", [
    ({"batch": 0}, "batch must be a positive integer"),
    ({"batch": 2.0}, "batch must be a positive integer"),
    ({"max_context": -5}, "max_context must be a positive integer"),
    ({"max_context": 1, "next_n": 2}, "max_context must be at least next_n"),
    ({"heads": 48}, "heads must be one of 16, 32, 64, 128, got 48"),
    ({"kv_format": "fp16"}, "kv_format must be one of 'bf16', 'fp8', got 'fp16'"),
    ({"next_n": 5}, "next_n must be one of 1, 2, 3, 4, got 5"),
    ({"next_n": True}, "next_n must be one of"),
    ({"topk": 256}, "topk must be one of 512, 1024, 2048, got 256"),
    ({"index_heads": 16}, "index_heads must be one of 32, 64, got 16"),
    ({"lse_base_e": 1}, "lse_base_e must be a bool"),
    ({"device": "nowhere"}, "device 'nowhere' is not a device"),
])
def test_construction_names_the_bad_argument(change, named):
    config = {**TINY, "kv_format": "fp8", "device": "cpu", **change}
    with pytest.raises(KernelInputError, match=f"^DecodeStep: {named}"):
        DecodeStep(**config)


@pytest.mark.skipif(GPU, reason="checks the message given where CUDA is missing")
def test_construction_on_cuda_without_a_gpu_says_so():
    with pytest.raises(KernelInputError, match="DecodeStep: device cuda asks for CUDA, but no CUDA GPU is visible"):
        DecodeStep(**TINY, kv_format="fp8", device="cuda")


def test_workspace_is_allocated_once_with_the_step_shapes():
    step = DecodeStep(batch=3, max_context=1000, heads=64, kv_format="bf16", next_n=2, topk=1024, device="cpu")
    assert step.max_pages == 16 and step.num_tokens == 6
    assert (step.topk_indices.shape, step.topk_indices.dtype) == ((3, 2, 1024), torch.int32)
    assert (step.output.shape, step.output.dtype) == ((6, 64, 512), torch.bfloat16)
    assert (step.lse.shape, step.lse.dtype) == ((6, 64), torch.float32)
    assert "DecodeStep(batch=3, max_context=1000, heads=64, kv_format='bf16', next_n=2" in repr(step)


# ------------------------------------------------------------------ DecodeStep: per-call checks

PER_CALL_CASES = {
    # name: (how the inputs change, what the message says)
    "q_index_dtype": (lambda t: {"q_index_fp8": t["q_index_fp8"].float()},
                      r"q_index_fp8 must be float8_e4m3fn \[2, 2, 32, 128\] on cpu, got float32"),
    "q_index_next_n": (lambda t: {"q_index_fp8": t["q_index_fp8"][:, :1]}, r"q_index_fp8 must be .* got .*\[2, 1, 32"),
    "index_cache_view": (lambda t: {"k_index_cache_fp8": t["k_index_cache_fp8"].view(-1, 64, 132)},
                         r"k_index_cache_fp8 must be int8 \['\*', 64, 1, 132\]"),
    "weights_strided": (lambda t: {"weights": torch.randn(2, 32, 2).transpose(1, 2)}, "weights must be contiguous"),
    "seq_lens_int64": (lambda t: {"seq_lens": t["seq_lens"].long()}, r"seq_lens must be int32 \[2\]"),
    "block_table_width": (lambda t: {"block_table": t["block_table"][:, :4]}, r"block_table must be int32 \[2, 8\]"),
    "block_table_meta": (lambda t: {"block_table": t["block_table"].to("meta")},
                         "block_table must be .* on cpu, got .* on meta"),
    "q_nope_heads": (lambda t: {"q_nope": t["q_nope"][:, :8]}, r"q_nope must be bfloat16 \[4, 16, 512\]"),
    "q_pe_last_dim": (lambda t: {"q_pe": torch.randn(4, 16, 128).to(torch.bfloat16)[..., ::2]},
                      "q_pe must have a contiguous last dimension"),
    "kv_cache_missing": (lambda t: {"kv_cache": None}, r"kv_cache is required \(kv_format 'fp8'\)"),
    "bf16_cache_on_fp8": (lambda t: {"ckv_cache": torch.zeros(1, 64, 512, dtype=torch.bfloat16)},
                          "ckv_cache is not an input of a step with kv_format 'fp8'"),
    "kv_cache_bytes": (lambda t: {"kv_cache": t["kv_cache"][..., :576].contiguous()},
                       r"kv_cache must be int8 \['\*', 64, 656\]"),
    "sm_scale_string": (lambda t: {"sm_scale": "0.1"}, "sm_scale must be a real number, got '0.1'"),
    "attn_sink_heads": (lambda t: {"attn_sink": torch.zeros(8)}, r"attn_sink must be float32 \[16\]"),
}


@pytest.mark.parametrize("case", list(PER_CALL_CASES))
def test_a_call_names_the_bad_argument(case):
    step = DecodeStep(**TINY, kv_format="fp8", device="cpu")
    inputs = step_inputs(step, seed=1)
    change, message = PER_CALL_CASES[case]
    inputs = {**inputs, **change(inputs)}
    sink = {"attn_sink": inputs.pop("attn_sink")} if "attn_sink" in inputs else {}
    poison_workspace(step)
    with pytest.raises(KernelInputError, match=f"^DecodeStep: {message}"):
        step(*(inputs[k] for k in INDEX_NAMES + MLA_NAMES), **caches(inputs), **sink)
    assert (step.topk_indices == INT_POISON).all(), "a refused call launches nothing"


def test_a_bf16_step_needs_both_caches_with_the_same_pages():
    step = DecodeStep(**TINY, kv_format="bf16", device="cpu")
    inputs = step_inputs(step, seed=2)
    args = [inputs[k] for k in INDEX_NAMES + MLA_NAMES]
    with pytest.raises(KernelInputError, match=r"^DecodeStep: kpe_cache is required \(kv_format 'bf16'\)"):
        step(*args, ckv_cache=inputs["ckv_cache"])
    with pytest.raises(KernelInputError, match="^DecodeStep: kpe_cache has 18 pages, ckv_cache 19"):
        step(*args, ckv_cache=inputs["ckv_cache"], kpe_cache=inputs["kpe_cache"][1:])
    with pytest.raises(KernelInputError, match="^DecodeStep: kv_cache is not an input of a step with kv_format 'bf16'"):
        step(*args, ckv_cache=inputs["ckv_cache"], kpe_cache=inputs["kpe_cache"], kv_cache=inputs["ckv_cache"])


# ------------------------------------------------------------------ DecodeStep: whole step on a CPU

@pytest.mark.skipif(not INTERPRETING, reason="runs the Triton kernels under TRITON_INTERPRET=1 (CPU machines)")
@pytest.mark.parametrize("config,kv_format,lse_base_e", [
    (TINY, "fp8", False),  # every row fits in topk: the structural path
    (TINY, "bf16", True),
    (TINY_SCORED, "fp8", False),  # rows past topk: scored, then the top-k's torch baseline
], ids=["fits-fp8", "fits-bf16-lsee", "scored-fp8"])
def test_interpreted_step_matches_the_chained_references(config, kv_format, lse_base_e, monkeypatch):
    monkeypatch.setattr(indexer_solution, "topk_page_transform", torch_topk)
    step = DecodeStep(**config, kv_format=kv_format, lse_base_e=lse_base_e, device="cpu")
    # Request 0 is longer than topk where the step allows it (scored), request 1 short (fits).
    inputs = step_inputs(step, seed=7, seq_lens=[step.max_context - 5, 70])
    poison_workspace(step)
    output, lse = call_step(step, inputs)
    assert output is step.output and lse is step.lse
    assert_matches_chained_references(step, inputs, output, lse)


# ------------------------------------------------------------------ masked ids: the device counters

STAGES = ("indexer", "topk", "attention")


def counts(counters: dict[str, torch.Tensor]) -> dict[str, int]:
    """What an engine reads off the counters, when it chooses to (a sync)."""
    return {stage: int(t) for stage, t in counters.items()}


@pytest.mark.skipif(not INTERPRETING, reason="runs the Triton kernels under TRITON_INTERPRET=1 (CPU machines)")
def test_a_corrupt_block_table_is_counted_where_the_engine_reads_it(monkeypatch):
    """Pages outside the caches are masked as the references mask them, and counted (once per request) in
    the tensors the engine got before the call; a reset zeroes those same tensors."""
    monkeypatch.delenv("DSACTL_CHECK", raising=False)
    step = DecodeStep(batch=2, max_context=192, heads=16, kv_format="fp8", topk=512, index_heads=32, device="cpu")
    counters = dsactl.ops.bad_index_counters("cpu")
    assert set(counters) == set(STAGES)
    assert all(t.dtype == torch.int32 and t.shape == (1,) for t in counters.values())
    inputs = step_inputs(step, seed=41, seq_lens=[190, 150])
    inputs["block_table"][0, 1] = inputs["kv_cache"].shape[0] + 5  # tokens 64-127 of request 0
    inputs["block_table"][1, 2] = -3  # tokens 128-149 of request 1
    dsactl.ops.reset_bad_index_counters("cpu")
    poison_workspace(step)
    output, lse = call_step(step, inputs)
    assert counts(counters) == {"indexer": 2, "topk": 0, "attention": 0}
    assert (step.topk_indices[0, 0, 64:128] == -1).all() and (step.topk_indices[1, 0, 128:] == -1).all()
    assert_matches_chained_references(step, inputs, output, lse)
    dsactl.ops.reset_bad_index_counters("cpu")
    assert counts(counters) == dict.fromkeys(STAGES, 0)
    assert all(t is counters[stage] for stage, t in dsactl.ops.bad_index_counters("cpu").items())


@pytest.mark.skipif(not INTERPRETING, reason="runs the Triton kernels under TRITON_INTERPRET=1 (CPU machines)")
def test_attention_ids_outside_the_cache_are_counted_and_reset_through_dsactl_ops(monkeypatch):
    monkeypatch.delenv("DSACTL_CHECK", raising=False)
    g = torch.Generator().manual_seed(43)
    tokens, heads, pages, topk = 2, 16, 2, 64
    ckv = torch.randn(pages, 64, 512, generator=g).bfloat16()
    kpe = torch.randn(pages, 64, 64, generator=g).bfloat16()
    case = {"q_nope": torch.randn(tokens, heads, 512, generator=g).bfloat16(),
            "q_pe": torch.randn(tokens, heads, 64, generator=g).bfloat16(),
            "sparse_indices": torch.randint(0, pages * 64, (tokens, topk), generator=g, dtype=torch.int32),
            "kv_cache": quantize_mla_kv(ckv, kpe), "sm_scale": SM_SCALE}
    case["sparse_indices"][0, :3] = torch.tensor([-7, pages * 64, 50_000_000], dtype=torch.int32)
    case["sparse_indices"][1, 5] = -1  # padding: masked, not counted
    counters = dsactl.ops.bad_index_counters("cpu")
    dsactl.ops.reset_bad_index_counters("cpu")
    outputs = {"output": torch.full((tokens, heads, 512), float("nan"), dtype=torch.bfloat16),
               "lse": torch.full((tokens, heads), float("nan"))}
    dsactl.ops.sparse_mla_decode_out(case["q_nope"], case["q_pe"], case["sparse_indices"], SM_SCALE,
                                     outputs["output"], outputs["lse"], kv_cache=case["kv_cache"])
    assert counts(counters) == {"indexer": 0, "topk": 0, "attention": 3}
    verdict = check(get(f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{topk}_ps64_fp8kv"), case, outputs)
    assert verdict.passed, verdict.problems
    dsactl.ops.reset_bad_index_counters("cpu")
    assert counts(counters) == dict.fromkeys(STAGES, 0)


# ------------------------------------------------------------------ GPU

GPU_CONTEXT = 4096  # rows of up to 4096 keys for topk 2048: the scoring and CUDA top-k path


@pytest.mark.gpu
@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("next_n", [1, 2])
def test_gpu_step_matches_the_chained_references(batch, heads, kv_format, next_n):
    step = DecodeStep(batch=batch, max_context=GPU_CONTEXT, heads=heads, kv_format=kv_format, next_n=next_n,
                      device="cuda")
    seq_lens = [GPU_CONTEXT - 17, 1000, 2048, 2049][:batch]  # scored, fits, exactly topk, one past
    inputs = step_inputs(step, seed=batch * heads + next_n, seq_lens=seq_lens)
    poison_workspace(step)
    output, lse = call_step(step, inputs)
    torch.cuda.synchronize()
    assert_matches_chained_references(step, inputs, output, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv_format", [(16, "fp8"), (128, "fp8"), (64, "bf16")])
def test_gpu_step_allocates_nothing_and_never_syncs(heads, kv_format):
    step = DecodeStep(batch=4, max_context=GPU_CONTEXT, heads=heads, kv_format=kv_format, device="cuda")
    inputs = step_inputs(step, seed=5)
    call_step(step, inputs)  # warm-up: kernels compiled, counters and libraries loaded
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.set_sync_debug_mode("error")
    try:
        output, lse = call_step(step, inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert output.data_ptr() == step.output.data_ptr() and lse.data_ptr() == step.lse.data_ptr()
    assert torch.cuda.memory_allocated() == before


def _copy_into(static: dict, fresh: dict) -> None:
    for name, t in fresh.items():
        if isinstance(t, torch.Tensor):
            static[name].copy_(t)


def _captured(step, static):
    """A CUDA graph of one step call on the static inputs, captured after a call on a side stream has
    compiled and loaded everything."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call_step(step, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call_step(step, static)
    return graph


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv_format,next_n", [(16, "fp8", 1), (128, "fp8", 2), (128, "bf16", 1)])
def test_gpu_cuda_graph_replay_on_new_inputs_matches_eager(heads, kv_format, next_n):
    step = DecodeStep(batch=4, max_context=GPU_CONTEXT, heads=heads, kv_format=kv_format, next_n=next_n,
                      device="cuda")
    static = step_inputs(step, seed=21)
    graph = _captured(step, static)
    for seed in (22, 23):
        # New q, new cache contents, new lengths and pages: the same tensors, new values.
        fresh = step_inputs(step, seed=seed, seq_lens=[GPU_CONTEXT, 3000 + seed, 64, 2048])
        _copy_into(static, fresh)
        poison_workspace(step)
        graph.replay()
        torch.cuda.synchronize()
        replayed = (step.topk_indices.clone(), step.output.clone(), step.lse.clone())
        assert_matches_chained_references(step, fresh, replayed[1], replayed[2])
        poison_workspace(step)
        call_step(step, static)
        torch.cuda.synchronize()
        assert torch.equal(replayed[0].sort(dim=-1).values, step.topk_indices.sort(dim=-1).values)
        torch.testing.assert_close(replayed[1], step.output, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(replayed[2], step.lse, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_gpu_compiled_ops_match_eager(heads):
    torch._dynamo.reset()
    step = DecodeStep(batch=4, max_context=GPU_CONTEXT, heads=heads, kv_format="fp8", device="cuda")
    inputs = step_inputs(step, seed=31)
    args = [inputs[k] for k in INDEX_NAMES] + [inputs["q_nope"], inputs["q_pe"], inputs["kv_cache"]]
    output, lse = torch.compile(lambda *a: decode(*a, topk=step.topk), fullgraph=True)(*args)
    expected_output, expected_lse = decode(*args, topk=step.topk)
    torch.testing.assert_close(output, expected_output, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, expected_lse, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
def test_gpu_a_corrupt_block_table_is_counted_across_graph_replays_without_a_sync(monkeypatch):
    """The counters live on the device: a captured step adds to them on every replay, and getting them,
    zeroing them and replaying never sync (sync debug mode raises on one); the engine reads them after a
    sync of its own choosing, not inside the graph."""
    monkeypatch.delenv("DSACTL_CHECK", raising=False)
    step = DecodeStep(batch=4, max_context=GPU_CONTEXT, heads=16, kv_format="fp8", device="cuda")
    static = step_inputs(step, seed=51, seq_lens=[GPU_CONTEXT - 17, 1000, 2048, 2049])
    counters = dsactl.ops.bad_index_counters("cuda")
    graph = _captured(step, static)
    # Request 0 is scored (4079 keys for topk 2048): two of its pages leave the cache, and its 3951 other
    # keys outscore their -inf, so the indexer counts each page once a call and the top-k picks none.
    static["block_table"][0, 3] = static["kv_cache"].shape[0] + 9
    static["block_table"][0, 40] = -5
    poison_workspace(step)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dsactl.ops.reset_bad_index_counters("cuda")
        graph.replay()
        graph.replay()
        held = dsactl.ops.bad_index_counters("cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(held[stage] is counters[stage] for stage in STAGES)
    assert counts(counters) == {"indexer": 4, "topk": 0, "attention": 0}
    assert_matches_chained_references(step, static, step.output, step.lse)
    dsactl.ops.reset_bad_index_counters("cuda")
    assert counts(counters) == dict.fromkeys(STAGES, 0)
