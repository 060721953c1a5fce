"""Command line: `python -m distributed_training {validate,train}` (and the same under a generated package's name).

Each subcommand lives with the code it drives; this module only wires them together. Modules are imported
lazily so that `validate` works without torch or pyspark installed, and `train` without the validation extras.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module relative to this package, one-line help)
COMMANDS = {
    "validate": (".bundle.validate", "check a bundle: schema, typed resources, references and compute guards"),
    "train": (".engines.launch", "train with one engine, on the cluster or locally (--local)"),
    "advise": (".compute.advise", "single node or several, which engine and node type, from model and data size"),
    "run": (".remote.run", "run a deployed job and follow it to the end"),
}


def _command_module(name: str):
    module_name, _ = COMMANDS[name]
    return importlib.import_module(module_name, __package__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        subparser.set_defaults(command=name)
        _command_module(name).add_arguments(subparser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _command_module(args.command).run(args)


def train_main() -> None:
    """The `train` entry point of the wheel, which a job's `python_wheel_task` calls.

    It exits rather than returns: the task runner ignores a return value, and a failed run must fail the task.
    """
    sys.exit(main(["train", *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
