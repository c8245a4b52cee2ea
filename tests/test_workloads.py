import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from dsactl import workloads
from dsactl.definitions import CONTEST_ATTENTION, CONTEST_INDEXER, get
from dsactl.errors import DsactlError
from dsactl.workloads import suites


def test_contest_suite_matches_the_contest_distribution():
    ws = workloads.suite("contest")
    idx = [w for w in ws if w.definition == CONTEST_INDEXER]
    att = [w for w in ws if w.definition == CONTEST_ATTENTION]
    assert len(idx) == 128 and len(att) == 23
    assert all(1 <= w.axes["batch_size"] <= 31 for w in idx)
    assert all(1 <= w.axes["max_num_pages"] <= 91 and w.axes["num_pages"] == 11923 for w in idx)
    assert max(max(w.params["seq_lens"]) for w in idx) <= 5824
    assert sum(w.axes["max_num_pages"] * 64 <= 2048 for w in idx) == 69
    for w in idx:  # max_num_pages is tight: the longest row needs every page
        assert (max(w.params["seq_lens"]) + 63) // 64 == w.axes["max_num_pages"]
    assert {w.axes["num_tokens"] for w in att} == {1, 2, 6, 7, 8}
    assert all(w.axes["num_pages"] == 8462 for w in att)


def test_suites_are_deterministic_and_ids_unique():
    for name in workloads.SUITES:
        a, b = workloads.suite(name), workloads.suite(name)
        assert a == b
        assert len({w.uuid for w in a}) == len(a)


def test_prefill_suite_gathers_each_cached_token_many_times():
    """Prefill chunks of 1K-8K query tokens over one 64K-token context, at the head counts FlashMLA's sparse
    prefill kernel takes, both KV formats (FP8 with the model's power-of-two scales); the prefill indexer over
    whole causal prompts (every token a query, token t seeing keys 0..t)."""
    everything = workloads.suite("prefill")
    indexer = [w for w in everything if w.definition.startswith("dsa_prefill_indexer")]
    assert [(w.axes["num_tokens"], w.axes["num_keys"]) for w in indexer] == [(4096, 4096), (16384, 16384), (65536, 65536)]
    assert all(w.params["prompts"] == (w.axes["num_keys"],) and "queries" not in w.params for w in indexer)
    ws = [w for w in everything if w not in indexer]
    assert {(get(w.definition).params["heads"], w.axes["num_tokens"]) for w in ws} == {
        (h, t) for h in (64, 128) for t in (1024, 2048, 4096, 8192)}
    assert {get(w.definition).params["fp8kv"] for w in ws} == {False, True}
    for w in ws:
        cached = w.axes["num_pages"] * 64
        assert cached == 65536 and w.axes["num_tokens"] * 2048 >= 32 * cached
        assert w.params.get("kv_scales") == ("ue8m0" if get(w.definition).params["fp8kv"] else None)
    assert not {w.uuid for w in everything} & {w.uuid for w in workloads.suite("all")}  # GPU-sized: not in `all`


def test_edge_suite_covers_the_adversarial_lengths():
    ws = workloads.suite("edge")
    lengths = {s for w in ws if "seq_lens" in w.params for s in w.params["seq_lens"]}
    assert set(suites.EDGE_LENGTHS) <= lengths
    assert {w.params.get("pattern") for w in ws} >= {"ties", "empty", "scattered", "duplicates", "all_equal", "nan"}


def test_inputs_are_fresh_per_seed_realistic_and_non_contiguous():
    w = workloads.suite("contest")[100]
    a, b = workloads.make_inputs(w, "cpu", 0), workloads.make_inputs(w, "cpu", 1)
    assert not torch.equal(a["weights"], b["weights"])
    assert torch.equal(a["weights"], workloads.make_inputs(w, "cpu", 0)["weights"])
    assert (a["q_index_fp8"].float() != 0).float().mean() > 0.9
    table, lens = a["block_table"], a["seq_lens"]
    used = torch.cat([table[i, : (int(s) + 63) // 64] for i, s in enumerate(lens)])
    assert len(set(used.tolist())) == used.numel()  # pages are distinct
    assert (used.diff() != 1).float().mean() > 0.9  # and shuffled, not contiguous


def test_attention_patterns():
    ws = {w.uuid: w for w in workloads.suite("edge")}
    x = workloads.make_inputs(ws["edge-attention-empty-h16-bf16"], "cpu", 0)
    assert (x["sparse_indices"] == -1).all()
    x = workloads.make_inputs(ws["edge-attention-scattered-h16-bf16"], "cpu", 0)
    valid = (x["sparse_indices"] != -1).sum(1).tolist()
    assert valid == [1, 100, 1500, 2047]
    assert (x["sparse_indices"][1, :100] == -1).any()  # -1 anywhere, not only at the tail


def test_large_q_workloads_pass_fp16s_range_with_the_usual_logits():
    """edge-attention-large-q-*: q times 2^17 (past fp16's 65504, which the Hopper FP8 path must handle)
    and sm_scale divided by as much, so the reference gives the unscaled workload's output and lse."""
    ws = {w.uuid: w for w in workloads.suite("edge")}
    for tag in ("h16-fp8", "h128-bf16"):
        w = ws[f"edge-attention-large-q-{tag}"]
        x = workloads.make_inputs(w, "cpu", 0)
        assert x["q_nope"].float().abs().amax(dim=(0, 2)).min() > 65504  # in every head
        plain = workloads.make_inputs(dataclasses.replace(w, params={k: v for k, v in w.params.items()
                                                                    if k not in ("q_scale", "sm_scale")}), "cpu", 0)
        assert torch.equal(x["q_nope"], (plain["q_nope"].float() * w.params["q_scale"]).bfloat16())
        d = get(w.definition)
        want, got = d.run_reference(plain), d.run_reference(x)
        torch.testing.assert_close(got["output"], want["output"], rtol=0, atol=0)
        torch.testing.assert_close(got["lse"], want["lse"], rtol=1e-6, atol=1e-6)


def _mla_scales(x):
    return x["kv_cache"].view(torch.uint8)[..., 512:528].contiguous().view(torch.float32)


def test_fp8_scale_workloads_take_power_of_two_scales_and_the_edge_suite_mixes_both():
    """scale-attention-*-fp8 quantize as the model writes its cache (ue8m0 scales); the edge suite's
    mixed-scales workloads put tokens of both kinds side by side."""
    is_pow2 = lambda s: s == torch.exp2(torch.log2(s).round())
    scale = {w.uuid: w for w in workloads.suite("scale")}["scale-attention-h16-t1-fp8"]
    x = workloads.make_inputs(dataclasses.replace(scale, axes={**scale.axes, "num_pages": 40}), "cpu", 0)
    assert is_pow2(_mla_scales(x)).all()
    edge = {w.uuid: w for w in workloads.suite("edge")}
    for tag in ("h16-fp8", "h128-fp8"):
        per_token = is_pow2(_mla_scales(workloads.make_inputs(edge[f"edge-attention-mixed-scales-{tag}"], "cpu", 0))).all(-1)
        assert 0.3 < per_token.float().mean() < 0.7


def test_select_filters_and_errors():
    assert all(w.definition == CONTEST_ATTENTION for w in workloads.select("contest", definition=CONTEST_ATTENTION))
    assert len(workloads.select("contest", workload_ids=["contest-attention-003"])) == 1
    two = workloads.select("contest", workload_ids=["contest-indexer-070", "contest-indexer-000"])
    assert [w.uuid for w in two] == ["contest-indexer-000", "contest-indexer-070"]  # suite order
    with pytest.raises(DsactlError, match="'missing' in suite contest for definition"):
        workloads.select("contest", definition=CONTEST_ATTENTION, workload_ids=["contest-attention-003", "missing"])
    with pytest.raises(DsactlError, match="unknown suite"):
        workloads.select("nope")
    with pytest.raises(DsactlError, match="no workload"):
        workloads.select("contest", workload_ids=["missing"])


def _write_dataset(root, inputs_line):
    d = get(CONTEST_ATTENTION)
    (root / "definitions" / "dsa_paged").mkdir(parents=True)
    (root / "definitions" / "dsa_paged" / f"{d.name}.json").write_text(json.dumps(d.to_json()))
    (root / "workloads" / "dsa_paged").mkdir(parents=True)
    (root / "workloads" / "dsa_paged" / f"{d.name}.jsonl").write_text(json.dumps(inputs_line) + "\n")


def test_dataset_loader_reads_random_scalar_and_safetensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(4 * 64, generator=g)[:2048 // 16].repeat(16)[:2048].to(torch.int32)
    (tmp_path / "blob").mkdir()
    save_file({"sparse_indices": idx[None].contiguous()}, str(tmp_path / "blob" / "w0.safetensors"))
    _write_dataset(tmp_path, {
        "uuid": "w0", "axes": {"num_tokens": 1, "num_pages": 4},
        "inputs": {"q_nope": {"type": "random"}, "q_pe": {"type": "random"}, "ckv_cache": {"type": "random"},
                   "kpe_cache": {"type": "random"}, "sm_scale": {"type": "scalar", "value": 0.1352337788608801},
                   "sparse_indices": {"type": "safetensors", "path": "blob/w0.safetensors",
                                      "tensor_key": "sparse_indices"}}})
    ws = workloads.load_dataset(tmp_path)
    assert [w.uuid for w in ws] == ["w0"]
    x = workloads.make_inputs(ws[0], "cpu", 0)
    assert torch.equal(x["sparse_indices"], idx[None])
    assert x["sm_scale"] == 0.1352337788608801 and x["ckv_cache"].shape == (4, 64, 512)
    get(CONTEST_ATTENTION).run_reference(x)


def test_dataset_errors_are_clear(tmp_path):
    with pytest.raises(DsactlError, match="not a flashinfer-bench dataset"):
        workloads.load_dataset(tmp_path)
    _write_dataset(tmp_path, {"uuid": "w0", "axes": {"num_tokens": 1, "num_pages": 4},
                              "inputs": {"sparse_indices": {"type": "safetensors", "path": "../../etc/passwd"}}})
    w = workloads.load_dataset(tmp_path)[0]
    with pytest.raises(DsactlError, match="no input spec|outside the dataset"):
        workloads.make_inputs(w, "cpu", 0)
    (tmp_path / "workloads" / "dsa_paged" / f"{CONTEST_ATTENTION}.jsonl").write_text("{not json\n")
    with pytest.raises(DsactlError, match="unreadable workload"):
        workloads.load_dataset(tmp_path)
