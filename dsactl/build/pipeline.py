"""One `dsactl build` for one arch: CUDA through ninja and Triton AOT side by side, then the report."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from dsactl.build import cuda, manifest, report, triton_aot
from dsactl.build.arch import Arch, nvcc_version
from dsactl.build.report import ReportRow
from dsactl.kernels.cuda_library import CudaSource
from dsactl.kernels.cuda_library import arch_dir as arch_build_dir

# on_progress(kind, label, done, total): kind is "cuda" or "triton"; called from two threads.
OnProgress = Callable[[str, str, int, int], None]


@dataclass(frozen=True)
class ArchBuild:
    arch: Arch
    rows: list[ReportRow]
    compiled_cuda: int  # libraries ninja rebuilt
    compiled_triton: int  # configurations compiled
    report_path: Path | None  # None when there was nothing to build

    @property
    def up_to_date(self) -> bool:
        return self.compiled_cuda == 0 and self.compiled_triton == 0


def build_arch(
    arch: Arch,
    *,
    cuda_sources: list[CudaSource],
    triton_configs: list[triton_aot.TritonConfig],
    jobs: int,
    on_progress: OnProgress,
) -> ArchBuild:
    triton_configs = [c for c in triton_configs if c.launches_on(arch)]
    if not cuda_sources and not triton_configs:
        return ArchBuild(arch, [], 0, 0, None)
    out = arch_build_dir(arch.name)
    out.mkdir(parents=True, exist_ok=True)
    # Fingerprints are taken before compiling: a source edited mid-build then reads as stale.
    fingerprints = {s.name: s.fingerprint() for s in cuda_sources}

    if cuda_sources:
        cuda.write_ninja_file(arch, out, cuda_sources)
    # ninja runs nvcc in the background while Triton compiles; leaving the block waits for both.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ninja") as background:
        ninja = background.submit(cuda.run_ninja, out, jobs, partial(on_progress, "cuda")) if cuda_sources else None
        triton_rows, compiled_triton = triton_aot.build(triton_configs, arch, out, jobs, partial(on_progress, "triton"))
        compiled_cuda = ninja.result() if ninja is not None else 0

    manifest.write(out, arch.name, fingerprints)
    seconds = cuda.compile_seconds(out)
    cuda_rows = [
        row
        for source in cuda_sources
        for row in cuda.library_rows(arch, out, source, seconds[source.library_file])
    ]
    rows = cuda_rows + triton_rows
    toolchain = {"nvcc": "%d.%d" % nvcc_version(), "triton": _triton_version()}
    path = report.write(out, arch.name, toolchain, rows)
    return ArchBuild(arch, rows, compiled_cuda, compiled_triton, path)


def _triton_version() -> str:
    import triton

    return triton.__version__
