{%- set engines = torch_engines(cookiecutter) -%}
"""Training runs locally the way the job runs it, on a sample of the default table, and beats the trivial predictor."""

{% if engines and cookiecutter.task == "fine_tune" -%}
def test_the_task_trains_and_beats_the_trivial_predictor(train, base_model):
    # The small random-weight model of conftest.py, fine-tuned in full (LoRA on random weights learns little): short
    # sequences and batches, so that two epochs of the sample (32 steps) are enough to learn its grammar.
    metrics = train("--engine", "{{ engines[0] }}", "--processes", "2", "--epochs", "2", "--base-model", base_model,
                    "--lora-rank", "0", "--max-length", "32", "--batch-size", "16")
    assert metrics["world_size"] == 2
    assert metrics["held_out_loss"] < 0.9 * metrics["baseline_loss"], metrics["final"]
    assert metrics["held_out_loss"] < 0.5 * metrics["start_held_out_loss"], metrics["final"]  # the base model's
    losses = [epoch["train_loss"] for epoch in metrics["epochs"]]
    assert losses[-1] < losses[0], losses
{%- elif engines -%}
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
