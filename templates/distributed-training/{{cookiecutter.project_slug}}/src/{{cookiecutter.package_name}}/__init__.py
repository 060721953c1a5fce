"""{{ cookiecutter.project_name }}: distributed training on Databricks. What is trained is `task.py`."""
