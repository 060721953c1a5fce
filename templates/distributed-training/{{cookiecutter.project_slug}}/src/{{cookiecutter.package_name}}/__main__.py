"""`python -m {{ cookiecutter.package_name }} {train,score} [options]`: what the jobs run, by hand."""

import sys

from . import launch, scoring

COMMANDS = {"train": launch.main, "score": scoring.main}
command = sys.argv[1] if len(sys.argv) > 1 else None
if command not in COMMANDS:
    sys.exit("usage: python -m {{ cookiecutter.package_name }} train --engine ENGINE [--local] [options], or score "
             "--model RUN_DIR [--local] [options] (--help lists them)")
sys.exit(COMMANDS[command](sys.argv[2:]))
