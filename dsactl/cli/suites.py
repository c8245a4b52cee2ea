"""The --suite help every command shares, written from the suites themselves so that it names each one."""

from __future__ import annotations

from dsactl.workloads.suites import ALL, SUITES

SUITE_HELP = f"Embedded workload suite: {', '.join(SUITES)}, or all ({', '.join(ALL)})."
