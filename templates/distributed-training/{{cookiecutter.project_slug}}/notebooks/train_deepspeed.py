{% from "notebook.py.j2" import training_notebook %}
{{- training_notebook(cookiecutter, "deepspeed", "Train with the DeepSpeed distributor") }}
