"""The tooling, which stays in this repository: validate a bundle, advise, run deployed jobs, the template's answers
and cluster specs, the command line. A generated project carries everything of this package but this folder."""
