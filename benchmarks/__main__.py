"""`python -m benchmarks [--quick] [--only SECTION ...] [--engines E ...] [--tasks T ...] [--output FILE]`: run the
benchmarks, print the table, write it as JSON. Run from the repository root with src/ on PYTHONPATH (benchmarks/run.sh
does both)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time

from . import data_memory, data_path, engines, fine_tuning, generation, scoring
from .measure import format_table

SECTIONS = {"data": data_path.run, "memory": data_memory.run, "generation": generation.run, "engines": engines.run,
            "reports": engines.run_reports, "scoring": scoring.run, "fine_tuning": fine_tuning.run}
DEFAULT_OUTPUT = os.path.join("build", "benchmarks", "results.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: checks that all runs")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), metavar="SECTION",
                        help=f"run only these sections ({', '.join(SECTIONS)}; default: all)")
    parser.add_argument("--engines", nargs="+", choices=engines.ENGINES, default=engines.ENGINES, metavar="ENGINE",
                        help=f"the engines section's engines ({', '.join(engines.ENGINES)}; default: all)")
    parser.add_argument("--tasks", nargs="+", choices=list(engines.TASKS), default=list(engines.TASKS), metavar="TASK",
                        help=f"the engines section's tasks ({', '.join(engines.TASKS)}; default: both)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help=f"where the JSON goes (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sections = {**SECTIONS, "engines": functools.partial(engines.run, engines=tuple(args.engines),
                                                          tasks=tuple(args.tasks))}
    started = time.perf_counter()
    rows, timings = [], {}
    with tempfile.TemporaryDirectory(prefix="benchmarks-") as work_dir:
        for name in args.only or SECTIONS:
            print(f"== {name} ==", flush=True)
            section_started = time.perf_counter()
            rows += sections[name](work_dir, args.quick)
            timings[name] = round(time.perf_counter() - section_started, 1)
    total = time.perf_counter() - started

    print("\n" + format_table(rows))
    print(f"\n{total:.0f} s in all ({', '.join(f'{name} {seconds:.0f} s' for name, seconds in timings.items())}); "
          f"{os.cpu_count()} CPU(s) shared with whatever else runs: medians (min-max over the runs); ratios of "
          "medians, both sides measured alternately in the same run, are the figures")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as file:
        json.dump({"quick": args.quick, "seconds": round(total, 1), "sections": timings,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                               "platform": platform.platform()},
                   "rows": [row.as_dict() for row in rows]}, file, indent=2)
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
