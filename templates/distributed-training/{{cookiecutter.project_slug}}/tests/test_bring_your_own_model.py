{%- set engine = (torch_engines(cookiecutter) + ["torch_distributor"])[0] -%}
{%- if cookiecutter.task in ("causal_lm", "fine_tune") -%}
"""The README's worked example trains: task.py changed into a recurrent language model
(examples/recurrent_language_model.py), and nothing else, gives a model that beats the bigram model."""


def test_a_recurrent_language_model_trains_through_the_same_loop(train):
    metrics = train("--engine", "{{ engine }}", "--task", "examples.recurrent_language_model", "--epochs", "4")
    assert metrics["held_out_loss"] < 0.5 * metrics["baseline_loss"], metrics["final"]
{%- else -%}
"""The README's worked example trains: task.py changed into a classifier (examples/trip_classifier.py), and nothing
else, gives a model that beats the trivial predictor."""


def test_a_classifier_task_trains_through_the_same_loop(train):
    metrics = train("--engine", "{{ engine }}", "--task", "examples.trip_classifier", "--epochs", "4")
    assert metrics["held_out_loss"] < 0.8 * metrics["baseline_loss"], metrics["final"]
    assert metrics["final"]["accuracy"] > metrics["final"]["baseline_accuracy"], metrics["final"]
{%- endif %}
