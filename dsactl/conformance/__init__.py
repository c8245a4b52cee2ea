"""Peers' own test suites run against dsactl's drop-in modules (dsactl.compat): each runner imports the peer's
test files from its checkout, with the peer's module name resolved to dsactl's, selects the cases dsactl
serves, and runs them through the peer's own generators, references and tolerances (report.py)."""
