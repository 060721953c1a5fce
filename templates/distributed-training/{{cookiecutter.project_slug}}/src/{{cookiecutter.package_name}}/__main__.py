"""`python -m {{ cookiecutter.package_name }} train --engine E [--local] [options]`: what the jobs run, by hand."""

import sys

from .launch import main

if sys.argv[1:2] != ["train"]:
    sys.exit("usage: python -m {{ cookiecutter.package_name }} train --engine ENGINE [--local] [options] "
             "(train --help lists them)")
sys.exit(main(sys.argv[2:]))
