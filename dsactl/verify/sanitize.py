"""compute-sanitizer (memcheck, racecheck) over the calls of a verify selection.

The calls run in a child `python -m dsactl verify ... --calls-only` under the
sanitizer; its log is parsed into errors per kernel. memcheck reports
`Invalid __global__ read ...` blocks whose `at <kernel>+0x.. in file:line`
(or, from older versions, `at 0x.. in file:line:kernel`) line names the kernel;
racecheck reports `Error: Race reported between <access> at <kernel>...`.
The child runs without PyTorch's caching allocator, so an access past a
tensor's end leaves its allocation instead of landing in a pooled neighbour.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from dsactl.errors import DsactlError

TOOLS = ("memcheck", "racecheck")
PREFIX = "========="
# memcheck stops printing after this many errors; the summary still counts all.
PRINT_LIMIT = 1000
LOG_TAIL_LINES = 20
HOST_SIDE = "(no device frame: host-side error)"

_SUMMARY = {
    "memcheck": re.compile(r"ERROR SUMMARY: (\d+) errors?"),
    "racecheck": re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"),
}
_RACE = re.compile(r"^(Error|Warning): Race reported between \w+ access at (.+)$")
_AT = re.compile(r"^at (.+)$")


@dataclass
class ToolReport:
    tool: str
    errors: int  # from the tool's summary line (hazard errors for racecheck)
    warnings: int
    per_kernel: dict[str, int] = field(default_factory=dict)  # errors shown in the log, by kernel
    exit_code: int = 0
    problem: str | None = None  # the run did not finish as a sanitizer run should
    log_tail: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.problem is None and self.errors == 0


def find_sanitizer() -> str:
    """Path of compute-sanitizer, or a DsactlError that says where it was looked for."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    for root in filter(None, roots):
        path = Path(root) / "bin" / "compute-sanitizer"
        if path.is_file():
            return str(path)
    raise DsactlError("--sanitize needs compute-sanitizer (it ships with the CUDA toolkit): not on PATH nor in "
                      "$CUDA_HOME/bin, $CUDA_PATH/bin or /usr/local/cuda/bin; install the toolkit or add its bin/ "
                      "to PATH")


def kernel_name(location: str) -> str:
    """The kernel of a sanitizer location, without return type and arguments:
    'void topk<4>(int*)+0x70 in topk.cu:12' or '0x70 in /x/topk.cu:12:void topk<4>(int*)' -> 'topk<4>'."""
    old = re.match(r"0x[0-9a-fA-F]+ in (.+)$", location)
    if old:
        name = re.split(r":\d+:", old.group(1))[-1]
    else:
        name = re.split(r"\+0x[0-9a-fA-F]+", location)[0]
        name = name.split(" in ")[0]
    name = name.strip()
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # drop the argument list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    return name[:cut].removeprefix("void ").strip() or location


def parse(tool: str, log: str, exit_code: int = 0) -> ToolReport:
    """Errors per kernel and the summary counts of one sanitizer log."""
    per_kernel: dict[str, int] = {}
    lines = [line[len(PREFIX):] for line in log.splitlines() if line.startswith(PREFIX)]
    pending = False  # a memcheck error header waits for its `at` line
    for raw in lines:
        text = raw.strip()
        top_level = raw.startswith(" ") and not raw.startswith("  ")
        if tool == "racecheck":
            m = _RACE.match(text)
            if m and m.group(1) == "Error":
                name = kernel_name(m.group(2))
                per_kernel[name] = per_kernel.get(name, 0) + 1
            continue
        if top_level and text and not text.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "LEAK SUMMARY",
                                                        "Saved host backtrace", "Host Frame", "Target application")):
            pending = True
            continue
        m = _AT.match(text)
        if pending and m:
            name = kernel_name(m.group(1))
            per_kernel[name] = per_kernel.get(name, 0) + 1
            pending = False
        elif pending and not text:
            per_kernel[HOST_SIDE] = per_kernel.get(HOST_SIDE, 0) + 1
            pending = False
    summary = _SUMMARY[tool].findall(log)
    report = ToolReport(tool, 0, 0, per_kernel, exit_code, log_tail=log.splitlines()[-LOG_TAIL_LINES:])
    if not summary:
        report.problem = f"no {tool} summary in the log (exit code {exit_code}): the run did not finish"
        return report
    if tool == "racecheck":
        report.errors = sum(int(s[1]) for s in summary)
        report.warnings = sum(int(s[2]) for s in summary)
    else:
        report.errors = sum(int(s) for s in summary)
    if exit_code != 0:
        report.problem = f"the calls under {tool} exited with code {exit_code}"
    return report


def child_command(sanitizer: str, tool: str, selection: Sequence[str]) -> list[str]:
    options = ["--print-limit", str(PRINT_LIMIT)] if tool == "memcheck" else []
    return [sanitizer, "--tool", tool, *options, sys.executable, "-m", "dsactl", "verify", *selection,
            "--calls-only", "--no-sanitize"]


def run(selection: Sequence[str], tools: Sequence[str] = TOOLS) -> list[ToolReport]:
    """Run the selection's calls once per tool under compute-sanitizer."""
    sanitizer = find_sanitizer()
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    reports = []
    for tool in tools:
        proc = subprocess.run(child_command(sanitizer, tool, selection), capture_output=True, text=True, env=env)
        reports.append(parse(tool, proc.stdout + proc.stderr, proc.returncode))
    return reports
