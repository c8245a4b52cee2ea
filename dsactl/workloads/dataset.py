"""Load a flashinfer-bench dataset folder as Workloads.

Layout: definitions/<op_type>/<name>.json, workloads/<op_type>/<name>.jsonl
(each line {"uuid", "axes", "inputs": {name: {"type": "random"} |
{"type": "scalar", "value": v} | {"type": "safetensors", "path", "tensor_key"}}}),
blob/... safetensors files (paths in workloads are relative to the dataset root).
Definitions must be ones dsactl knows (same contract, same reference).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dsactl.definitions import get
from dsactl.errors import DsactlError
from dsactl.workloads.workload import Workload


def load_dataset(root: str | Path) -> list[Workload]:
    root = Path(root)
    if not (root / "workloads").is_dir():
        raise DsactlError(f"{root}: not a flashinfer-bench dataset (no workloads/ folder)")
    known = {p.stem for p in (root / "definitions").glob("*/*.json")} if (root / "definitions").is_dir() else set()
    out = []
    for path in sorted((root / "workloads").glob("*/*.jsonl")):
        name = path.stem
        if known and name not in known:
            raise DsactlError(f"{path}: no definitions/*/{name}.json in the dataset")
        get(name)  # raises a clear error for a definition dsactl does not know
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                axes = {k: int(v) for k, v in row["axes"].items()}
                inputs = row["inputs"]
                uuid = str(row["uuid"])
            except (ValueError, KeyError, TypeError) as e:
                raise DsactlError(f"{path}:{lineno}: unreadable workload ({e})") from None
            out.append(Workload(uuid, name, f"dataset:{root.name}", "dataset", axes,
                                {"inputs": inputs, "root": str(root)}))
    if not out:
        raise DsactlError(f"{root}: no workloads found under workloads/*/*.jsonl")
    return out


def _random_tensor(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, device=device).to(dtype)
    return torch.randint(0, 64, shape, generator=g, device=device).to(dtype)


def make_dataset_inputs(w: Workload, device, seed: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    d = get(w.definition)
    axes = {**d.const_axes, **w.axes}
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    root = Path(w.params["root"])
    cache: dict[Path, dict[str, torch.Tensor]] = {}
    out: dict[str, Any] = {}
    for spec in d.inputs:
        desc = w.params["inputs"].get(spec.name)
        if desc is None:
            raise DsactlError(f"workload {w.uuid}: no input spec for {spec.name}")
        kind = desc.get("type")
        if kind == "scalar":
            out[spec.name] = desc["value"]
        elif kind == "random":
            shape = tuple(a if isinstance(a, int) else axes[a] for a in spec.shape)
            out[spec.name] = _random_tensor(shape, spec.torch_dtype, g, device)
        elif kind == "safetensors":
            path = (root / desc["path"]).resolve()
            if root.resolve() not in path.parents:
                raise DsactlError(f"workload {w.uuid}: {desc['path']} points outside the dataset")
            if not path.is_file():
                raise DsactlError(f"workload {w.uuid}: missing blob {path}")
            if path not in cache:
                cache[path] = load_file(str(path))
            key = desc.get("tensor_key", spec.name)
            if key not in cache[path]:
                raise DsactlError(f"workload {w.uuid}: {path.name} has no tensor {key!r}")
            out[spec.name] = cache[path][key].to(device)
        else:
            raise DsactlError(f"workload {w.uuid}: input {spec.name} has unknown type {kind!r}")
    return out
