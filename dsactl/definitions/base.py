"""Definition: an operator's contract as plain data plus its PyTorch reference.

Shapes are tuples of axis names or integers; axes are either constants of the
definition or variables read from the inputs. `check_inputs` enforces shapes and
dtypes with one clear error per problem, so no kernel sees a malformed call.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from dsactl.errors import DsactlError

if TYPE_CHECKING:  # annotations only: listing definitions imports no torch
    import torch

# The dtypes a TensorSpec may name: torch's attribute names (torch is imported only where a tensor is
# made or checked, so that listing definitions imports no torch).
DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "int64", "int32", "int8", "uint8")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[str | int, ...]  # axis names or fixed sizes; () is a scalar
    dtype: str
    description: str = ""

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise DsactlError(f"{self.name}: unknown dtype {self.dtype!r} (one of {', '.join(DTYPES)})")

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()


@dataclass(frozen=True)
class Definition:
    name: str
    op_type: str
    description: str
    const_axes: Mapping[str, int]
    var_axes: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    constraints: tuple[str, ...]
    reference: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    # Module-level functions the reference calls, shipped with it in to_json().
    reference_helpers: tuple[Callable[..., Any], ...] = ()

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def signature(self) -> list[str]:
        """Destination-passing-style argument order: inputs, then outputs."""
        return self.input_names + self.output_names

    def axis_values(self, tensors: Mapping[str, Any]) -> dict[str, int]:
        """Resolve every axis from the given tensors; inconsistent sizes raise."""
        import torch

        values = dict(self.const_axes)
        source = {axis: "the definition" for axis in values}  # where each axis's size was read
        for spec in self.inputs + self.outputs:
            t = tensors.get(spec.name)
            if t is None or spec.is_scalar or not isinstance(t, torch.Tensor):
                continue
            if t.dim() != len(spec.shape):
                raise DsactlError(
                    f"{self.name}: {spec.name} must have {len(spec.shape)} dims "
                    f"{list(spec.shape)}, got shape {list(t.shape)}"
                )
            for axis, size in zip(spec.shape, t.shape):
                if isinstance(axis, int):
                    if size != axis:
                        raise DsactlError(
                            f"{self.name}: {spec.name} has size {size} where {axis} is required "
                            f"(shape {list(t.shape)}, expected {list(spec.shape)})"
                        )
                    continue
                if axis in values and values[axis] != size:
                    raise DsactlError(
                        f"{self.name}: axis {axis} is {size} in {spec.name} (shape {list(t.shape)}) "
                        f"but {values[axis]} in {source[axis]}"
                    )
                values[axis] = int(size)
                source.setdefault(axis, spec.name)
        return values

    def check_inputs(self, tensors: Mapping[str, Any], with_outputs: bool = False) -> dict[str, int]:
        """Check presence, dtype and shape of inputs (and outputs); return the axes."""
        import torch

        specs = self.inputs + (self.outputs if with_outputs else ())
        for spec in specs:
            if spec.name not in tensors:
                raise DsactlError(f"{self.name}: missing {spec.name}")
            t = tensors[spec.name]
            if spec.is_scalar:
                if isinstance(t, torch.Tensor) and t.numel() != 1:
                    raise DsactlError(f"{self.name}: {spec.name} must be a scalar")
                continue
            if not isinstance(t, torch.Tensor):
                raise DsactlError(f"{self.name}: {spec.name} must be a tensor, got {type(t).__name__}")
            if t.dtype != spec.torch_dtype:
                raise DsactlError(
                    f"{self.name}: {spec.name} must be {spec.dtype}, got {str(t.dtype).removeprefix('torch.')}"
                )
        return self.axis_values({s.name: tensors[s.name] for s in specs})

    def output_shapes(self, axes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        return {
            o.name: tuple(a if isinstance(a, int) else axes[a] for a in o.shape) for o in self.outputs
        }

    def allocate_outputs(self, axes: Mapping[str, int], device: torch.device | str) -> dict[str, torch.Tensor]:
        """Outputs as a harness allocates them: torch.empty, never pre-zeroed."""
        import torch

        shapes = self.output_shapes(axes)
        return {o.name: torch.empty(shapes[o.name], dtype=o.torch_dtype, device=device) for o in self.outputs}

    def run_reference(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        import torch

        out = self.reference(**{n: inputs[n] for n in self.input_names}, **self.params_for_reference())
        if isinstance(out, torch.Tensor):
            out = (out,)
        return dict(zip(self.output_names, out))

    def params_for_reference(self) -> dict[str, Any]:
        accepted = inspect.signature(self.reference).parameters
        return {k: v for k, v in self.params.items() if k in accepted}

    def to_json(self) -> dict[str, Any]:
        """flashinfer-bench Definition schema."""
        axes: dict[str, Any] = {k: {"type": "const", "value": v} for k, v in self.const_axes.items()}
        axes.update({k: {"type": "var"} for k in self.var_axes})

        def tensors(specs: tuple[TensorSpec, ...]) -> dict[str, Any]:
            return {
                s.name: {
                    "shape": None if s.is_scalar else [str(a) for a in s.shape],
                    "dtype": s.dtype,
                    **({"description": s.description} if s.description else {}),
                }
                for s in specs
            }

        return {
            "name": self.name,
            "op_type": self.op_type,
            "description": self.description,
            "tags": list(self.tags),
            "axes": axes,
            "constraints": list(self.constraints),
            "inputs": tensors(self.inputs),
            "outputs": tensors(self.outputs),
            "reference": self.reference_source(),
        }

    def reference_source(self) -> str:
        """Self-contained Python source with a top-level `run(<inputs>)` (the
        flashinfer-bench convention): the FP8 layouts, the helpers, the reference."""
        from dsactl.kernels import fp8

        layouts = inspect.getsource(fp8).replace("from __future__ import annotations\n", "")
        parts = ["import math\n\nimport torch\n", layouts]
        parts += [inspect.getsource(f) for f in (*self.reference_helpers, self.reference)]
        keywords = [f"{n}={n}" for n in self.input_names]
        keywords += [f"{k}={v!r}" for k, v in self.params_for_reference().items()]
        parts.append(f"def run({', '.join(self.input_names)}):\n"
                     f"    return {self.reference.__name__}({', '.join(keywords)})\n")
        return "\n\n".join(parts)
