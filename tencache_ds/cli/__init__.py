"""The `tencache-ds` command line. Owns: argument parsing (main.py) and the subcommands' orchestration (doctor.py,
bench.py). Does not own: the checks' arithmetic (plan/), the comparison (bench/report.py) or training
(scripts/train.py). Importing this package imports neither torch nor deepspeed.
"""
