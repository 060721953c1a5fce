{%- set engines = torch_engines(cookiecutter) -%}
"""Training runs locally the way the job runs it, on a sample of the default table, and beats the trivial predictor."""

{% if engines -%}
def test_the_task_trains_and_beats_the_trivial_predictor(train):
    metrics = train("--engine", "{{ engines[0] }}", "--processes", "2", "--epochs", "3")
    assert metrics["world_size"] == 2
    assert metrics["held_out_loss"] < 0.9 * metrics["baseline_loss"], metrics["final"]
    losses = [epoch["train_loss"] for epoch in metrics["epochs"]]
    assert losses[-1] < losses[0], losses
{%- else -%}
def test_the_spark_ml_pipeline_trains_and_beats_the_mean(train):
    metrics = train("--engine", "spark_ml_connect")
    assert metrics["held_out_loss"] < 0.5 * metrics["baseline_loss"], metrics["final"]
{%- endif %}
