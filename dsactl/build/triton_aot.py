"""Ahead-of-time Triton: compile every configuration that kernel modules ship, for one arch.

A module under dsactl.kernels that ships configurations defines `aot_specs() -> list[dict]`
with the keys of SPEC_KEYS, and "min_shared" (bytes) where only GPUs whose blocks get at least that
much shared memory launch it: an arch with less does not build it. A signature type may end in `:16`
(as in Triton's own AOT tool): the argument is a multiple of 16 in the calls the configuration is
built for, the specialization the JIT makes for such a value. Each configuration compiles (no GPU needed) to
build/<arch>/triton/<stage.module>/<name>.cubin with its ptxas log and a record of its
resources; the record's fingerprint (Triton version, arch, the function's source and
everything it calls, signature, constants, options) makes an unchanged configuration
skip compiling. Compiles run in spawned worker processes: Triton's ptxas log arrives on
stdout, which must not be shared with the progress display. Each worker would print Triton's
warnings once per process; they come back with the rows and are printed once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import inspect
import io
import json
import multiprocessing
import os
import pkgutil
import re
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dsactl.build import cuobjdump, ptxas
from dsactl.build.arch import Arch
from dsactl.build.report import ReportRow
from dsactl.errors import DsactlError
from dsactl.kernels.triton_options import FP_FUSION

KERNELS_PACKAGE = "dsactl.kernels"
SPEC_KEYS = frozenset({"name", "fn", "signature", "constexprs", "num_warps", "num_stages"})
OPTIONAL_SPEC_KEYS = frozenset({"min_shared"})
WARP_SIZE = 32
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# TRITON_DUMP_PTXAS_LOG makes Triton print ptxas -v's log; TRITON_ALWAYS_COMPILE makes ptxas
# run even when Triton's own cache holds the kernel (our fingerprint decides what to skip).
_TRITON_ENV = {"TRITON_DUMP_PTXAS_LOG": "1", "TRITON_ALWAYS_COMPILE": "1"}


@dataclass(frozen=True, eq=False)
class TritonConfig:
    module: str  # full dotted name of the module that ships it
    spec: dict

    @property
    def unit(self) -> str:
        return self.module.removeprefix(KERNELS_PACKAGE + ".")

    @property
    def name(self) -> str:
        return self.spec["name"]

    def launches_on(self, arch: Arch) -> bool:
        """Whether a GPU of this arch launches it (its blocks get the shared memory it is meant for)."""
        return self.spec.get("min_shared", 0) <= arch.max_shared_per_block

    def out_dir(self, arch_dir: Path) -> Path:
        return arch_dir / "triton" / self.unit

    def fingerprint(self, arch: Arch) -> str:
        import triton

        spec = self.spec
        key = {
            "triton": triton.__version__,
            "arch": arch.name,
            "unit": self.unit,
            "name": self.name,
            "fn": spec["fn"].cache_key,
            "signature": spec["signature"],
            "constexprs": {k: repr(v) for k, v in spec["constexprs"].items()},
            "num_warps": spec["num_warps"],
            "num_stages": spec["num_stages"],
            "enable_fp_fusion": FP_FUSION,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def discover(package: str = KERNELS_PACKAGE) -> list[TritonConfig]:
    """Every configuration of every module under package that defines aot_specs()."""
    _refuse_interpreter()
    root = importlib.import_module(package)
    configs = []
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        try:
            module = importlib.import_module(info.name)
        except Exception as e:
            raise DsactlError(f"cannot import kernel module {info.name}: {type(e).__name__}: {e}") from e
        if hasattr(module, "aot_specs"):
            configs += module_configs(info.name, module.aot_specs())
    return configs


def module_configs(module: str, specs: list[dict]) -> list[TritonConfig]:
    """Checked configurations of one module."""
    import triton

    seen = set()
    configs = []
    for spec in specs:
        where = f"{module}.aot_specs() entry {spec.get('name', '?')!r}"
        if not SPEC_KEYS <= set(spec) <= SPEC_KEYS | OPTIONAL_SPEC_KEYS:
            raise DsactlError(
                f"{where}: keys must be {sorted(SPEC_KEYS)} (and optionally {sorted(OPTIONAL_SPEC_KEYS)}); missing "
                f"{sorted(SPEC_KEYS - set(spec))}, unknown {sorted(set(spec) - SPEC_KEYS - OPTIONAL_SPEC_KEYS)}"
            )
        if not _SAFE_NAME.match(spec["name"]) or spec["name"] in seen:
            raise DsactlError(f"{where}: names must be unique and use only letters, digits, _ . -")
        if not isinstance(spec["fn"], triton.runtime.jit.JITFunction):
            raise DsactlError(f"{where}: fn must be a @triton.jit function")
        hinted = [f"{n}: {t}" for n, t in spec["signature"].items() if ":" in t and not _DIVISIBLE.fullmatch(t)]
        if hinted:
            raise DsactlError(f"{where}: the only signature hint is ':16' on an integer or pointer type; got {hinted}")
        seen.add(spec["name"])
        configs.append(TritonConfig(module, spec))
    return configs


def recorded_row(config: TritonConfig, arch: Arch, arch_dir: Path) -> ReportRow | None:
    """The row from an earlier compile of exactly this configuration, if its cubin is still there."""
    out = config.out_dir(arch_dir)
    record, cubin = out / f"{config.name}.json", out / f"{config.name}.cubin"
    if not (record.is_file() and cubin.is_file()):
        return None
    saved = json.loads(record.read_text())
    if saved["fingerprint"] != config.fingerprint(arch):
        return None
    return ReportRow(**saved["row"])


def compile_config(config: TritonConfig, arch: Arch, arch_dir: Path) -> ReportRow:
    """Compile one configuration for arch; write its cubin, ptxas log and record."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = config.spec
    signature = {name: ty.removesuffix(DIVISIBLE_SUFFIX) for name, ty in spec["signature"].items()}
    source = ASTSource(spec["fn"], signature, attrs=_divisibility(spec),
                       **{_constexpr_keyword(ASTSource): spec["constexprs"]})
    log = io.StringIO()
    start = time.perf_counter()
    with _environment(_TRITON_ENV), contextlib.redirect_stdout(log):
        compiled = triton.compile(
            source,
            target=GPUTarget("cuda", arch.triton_cc, WARP_SIZE),
            options={"num_warps": spec["num_warps"], "num_stages": spec["num_stages"], "enable_fp_fusion": FP_FUSION},
        )
    seconds = time.perf_counter() - start

    out = config.out_dir(arch_dir)
    out.mkdir(parents=True, exist_ok=True)
    cubin = out / f"{config.name}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    (out / f"{config.name}.ptxas.log").write_text(log.getvalue())
    kernels = ptxas.parse(log.getvalue())
    if len(kernels) != 1:
        raise DsactlError(
            f"{config.unit}:{config.name}: expected Triton's ptxas log to describe one kernel, found "
            f"{len(kernels)} (does triton {triton.__version__} honour TRITON_DUMP_PTXAS_LOG?)"
        )
    kernel = kernels[0]
    binary = cuobjdump.resource_usage(cubin).get(kernel.name)
    if binary is None or binary.registers != kernel.registers:
        raise DsactlError(f"{config.unit}:{config.name}: ptxas log and {cubin} disagree on {kernel.name}")
    row = ReportRow(
        arch=arch.name,
        kind="triton",
        unit=config.unit,
        kernel=kernel.name,
        configuration=config.name,
        registers=kernel.registers,
        shared_static=kernel.shared_static,
        shared_dynamic=compiled.metadata.shared,
        stack_frame=kernel.stack_frame,
        local=binary.local,
        spill_stores=kernel.spill_stores,
        spill_loads=kernel.spill_loads,
        compile_s=round(seconds, 3),
        options={
            "num_warps": spec["num_warps"],
            "num_stages": spec["num_stages"],
            "enable_fp_fusion": FP_FUSION,
            "constexprs": {k: _jsonable(v) for k, v in spec["constexprs"].items()},
        },
    )
    record = {"fingerprint": config.fingerprint(arch), "row": dataclasses.asdict(row)}
    (out / f"{config.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return row


def build(
    configs: list[TritonConfig],
    arch: Arch,
    arch_dir: Path,
    jobs: int,
    on_compiled: Callable[[str, int, int], None],
) -> tuple[list[ReportRow], int]:
    """Rows for every configuration, compiling only the changed ones; returns (rows, how many compiled).

    on_compiled(label, done, total) before the first compile and after each."""
    rows: dict[int, ReportRow] = {}
    warned: set[tuple[type, str]] = set()
    stale = []
    for i, config in enumerate(configs):
        row = recorded_row(config, arch, arch_dir)
        if row is None:
            stale.append(i)
        else:
            rows[i] = row
    if stale:
        on_compiled("", 0, len(stale))
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(stale)), mp_context=context) as pool:
            futures = {
                pool.submit(_compile_in_worker, configs[i].module, configs[i].name, arch, arch_dir): i
                for i in stale
            }
            for done, future in enumerate(as_completed(futures), start=1):
                i = futures[future]
                rows[i], caught = future.result()
                for category, message in caught:
                    if (category, message) not in warned:
                        warned.add((category, message))
                        warnings.warn(message, category, stacklevel=2)
                on_compiled(f"{configs[i].unit}:{configs[i].name}", done, len(stale))
    return [rows[i] for i in range(len(configs))], len(stale)


def _compile_in_worker(module: str, name: str, arch: Arch, arch_dir: Path
                       ) -> tuple[ReportRow, list[tuple[type[Warning], str]]]:
    configs = module_configs(module, importlib.import_module(module).aot_specs())
    (config,) = [c for c in configs if c.name == name]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            row = compile_config(config, arch, arch_dir)
        return row, [(w.category, str(w.message)) for w in caught]
    except DsactlError:
        raise
    except Exception as e:  # Triton's own errors may not survive pickling back to the parent
        raise DsactlError(f"{config.unit}:{name}: triton failed for {arch.name}: {type(e).__name__}: {e}") from None


# The JIT launcher specializes every tensor pointer as 16-byte divisible (torch
# allocations are), and every integer argument that is a multiple of 16 (unless the kernel
# opts out with do_not_specialize); without the same hints the AOT compile emits narrow
# loads and reports registers, shared memory and spills of a kernel that never runs.
# Pointers always get the hint; an integer gets it when its signature type ends in ":16".
POINTER_ALIGNMENT = 16
DIVISIBLE_SUFFIX = ":16"
_DIVISIBLE = re.compile(r"(\*\w+|i32|i64|u32|u64):16")


def _divisibility(spec: dict) -> dict:
    arg_names = spec["fn"].arg_names
    return {(arg_names.index(name),): [["tt.divisibility", POINTER_ALIGNMENT]]
            for name, ty in spec["signature"].items() if ty.startswith("*") or ty.endswith(DIVISIBLE_SUFFIX)}


def _constexpr_keyword(ast_source: type) -> str:
    """ASTSource's name for the constants argument: `constexprs` (triton >= 3.2), `constants` before."""
    parameters = inspect.signature(ast_source).parameters
    for keyword in ("constexprs", "constants"):
        if keyword in parameters:
            return keyword
    raise DsactlError(f"unsupported triton: ASTSource{inspect.signature(ast_source)}")


def _refuse_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise DsactlError("TRITON_INTERPRET is set: unset it to build (the interpreter compiles nothing)")


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _jsonable(value):
    return value if isinstance(value, (bool, int, float, str)) else str(value)
