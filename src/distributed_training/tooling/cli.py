"""The tool's command line: `python -m distributed_training {validate,advise,run,train,score}`.

`validate`, `advise` and `run` are this repository's tooling (a generated project gets them as a development
dependency); `train` and `score` are the runtime's own entry points, the ones every generated project carries. Each
subcommand lives with the code it drives, imported lazily: `validate` works without torch or pyspark, `train` without
the validation extras.
"""

from __future__ import annotations

import argparse
import importlib
import sys

PACKAGE = __package__.rpartition(".")[0]  # what `python -m` runs: the package that holds the tooling and the runtime
# name -> (module relative to the tooling, one-line help)
TOOLS = {
    "validate": (".bundle.validate", "check a bundle offline by the Databricks CLI's rules and severities, and the "
                                     "compute guards"),
    "advise": (".advise.command", "single node or several, which engine and node type, from model and data size"),
    "run": (".remote.run", "run a deployed job and follow it to the end"),
}
# the runtime's own, whose parsers are their own: name -> (module relative to the tooling, one-line help)
RUNTIME = {
    "train": ("..launch", "train with one engine, on the cluster or locally (--local); `train --help` lists its "
                          "options"),
    "score": ("..scoring", "score a table with a training run's model; `score --help` lists its options"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in RUNTIME.items():
        subparsers.add_parser(name, help=help_text, add_help=False)
    for name, (module, help_text) in TOOLS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module, __package__).add_arguments(subparser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in RUNTIME:  # train's options depend on the task (--task)
        return importlib.import_module(RUNTIME[argv[0]][0], __package__).main(argv[1:])
    args = build_parser().parse_args(argv)
    return importlib.import_module(TOOLS[args.command][0], __package__).run(args)


if __name__ == "__main__":
    sys.exit(main())
