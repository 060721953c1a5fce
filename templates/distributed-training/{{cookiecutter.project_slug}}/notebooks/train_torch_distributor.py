{% from "notebook.py.j2" import training_notebook %}
{{- training_notebook(cookiecutter, "torch_distributor", "Train with TorchDistributor") }}
