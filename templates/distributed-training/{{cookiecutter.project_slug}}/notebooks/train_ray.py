{% from "notebook.py.j2" import training_notebook %}
{{- training_notebook(cookiecutter, "ray", "Train with Ray on Spark") }}
