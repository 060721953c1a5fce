{% from "notebook.py.j2" import training_notebook %}
{{- training_notebook(cookiecutter, "spark_ml_connect", "Train a Spark ML pipeline through Spark Connect") }}
