"""A bundle file without anchors or aliases is measured, checked for repeated keys and built in one walk over its
nodes (`yaml_files._built`); every other file, and any document that walk leaves alone, takes the three passes it
replaces. Both ways must give the same data (types included), the same findings and the same count against the
bundle's value budget: shown on every file of the rendered projects and of the hand-broken fixtures, and on the
YAML forms where PyYAML's constructor does something of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_training.tooling.bundle import yaml_files
from distributed_training.tooling.bundle.yaml_files import MAX_DEPTH, ValueBudget, load_yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"
FORMS = {
    "scalars": "a: 1\nb: 0x1f\nc: 1_000\nd: 1.5\ne: .inf\nf: ~\ng: null\nh: true\ni: yes\nj: 2026-01-01\nk: '5'\n"
               "l: -.5e3\nm: 0o17\nn: 1:30\no: ''\n",
    "keys of other kinds": "1: one\ntrue: t\nnull: n\n1.5: f\n",
    "repeated keys": "a: 1\nb: {c: 1, c: 2}\na: [x, {d: 1, d: 2}]\n",
    "a merge key": "a: {<<: {x: 1}, y: 2}\n",
    "a tag of its own": "a: !!str 5\nb: !!binary aGk=\n",
    "an unknown tag": "a: !custom x\n",
    "a collection as a key": "? [a, b]\n: c\n",
    "the value key": "a: =\n",
    "a list at the top": "- a\n- b\n",
    "a scalar at the top": "just text\n",
    "empty": "",
    "globs": "include: [resources/*.yml, 'a*b', \"c&d\"]\nlibraries: [{whl: ../dist/*.whl}]\n",
    "an alias": "a: &x [1, 2]\nb: *x\n",
    "an alias in flow": "a: &x 1\nb: {c: [*x],d:*x}\n",
    "an alias after a byte order mark": "\ufeff*x\n",
    "an alias of itself": "a: &x [*x]\n",
    "too deep": "a: " + "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2) + "\n",
    "deep but within": "a: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "\n",
}


def loaded(path: Path, budget_values: int, one_walk: bool, monkeypatch) -> tuple:
    with monkeypatch.context() as patch:
        if not one_walk:
            patch.setattr(yaml_files, "_built", lambda *arguments: (_ for _ in ()).throw(yaml_files._NotPlain()))
        budget = ValueBudget(left=budget_values, limit=budget_values)
        result = load_yaml(path, path.name, budget)
    return result.data, _typed(result.data), result.findings, result.anchor_paths, budget.left


def _typed(data):
    """The data with every value's type beside it (1 == True == 1.0 in Python: equality alone hides a wrong type)."""
    if isinstance(data, dict):
        return {(type(key).__name__, key): _typed(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_typed(item) for item in data]
    return type(data).__name__, data


def files_to_compare(tmp_path_factory, render_into) -> list[Path]:
    files = sorted(FIXTURES.rglob("*.yml"))
    for answers in ({"engine": "all"}, {"compute": "serverless_gpu", "engine": "deepspeed", "task": "causal_lm"}):
        project = render_into(tmp_path_factory.mktemp("project") / "out", **answers)
        files += sorted(project.rglob("*.yml"))
    folder = tmp_path_factory.mktemp("forms")
    for name, text in FORMS.items():
        (folder / f"{name.replace(' ', '_')}.yml").write_text(text)
        files.append(folder / f"{name.replace(' ', '_')}.yml")
    return files


def test_one_walk_gives_what_the_three_passes_give(tmp_path_factory, render_into, monkeypatch):
    files = files_to_compare(tmp_path_factory, render_into)
    assert len(files) > 50
    taken = 0
    for path in files:
        for budget_values in (5_000_000, 12):  # and a budget that runs out inside most files
            one_walk = loaded(path, budget_values, True, monkeypatch)
            assert one_walk == loaded(path, budget_values, False, monkeypatch), path
        taken += not yaml_files.ANCHOR_OR_ALIAS.search(path.read_text())
    assert taken > 40  # most files take the one walk: a glob is no alias


@pytest.mark.parametrize("form, expected", [
    ("repeated keys", ["duplicate-key"] * 3),
    ("too deep", ["yaml-too-deep"]),
    ("a collection as a key", ["yaml-syntax"]),
    ("an unknown tag", ["yaml-syntax"]),
    ("an alias of itself", ["yaml-recursive-alias"]),
])
def test_the_forms_give_their_findings(tmp_path, form, expected):
    path = tmp_path / "file.yml"
    path.write_text(FORMS[form])
    assert [finding.rule for finding in load_yaml(path, "file.yml").findings] == expected
