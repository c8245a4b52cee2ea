"""dsactl tune: search the kernels' launch knobs per shape bucket and write the winners to the
per-GPU tables the launchers read (kernels/tuned.py; docs/design.md, "Tuning")."""
