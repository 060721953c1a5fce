"""`validate` against the Databricks CLI's verdicts (issue 34): a bundle the CLI accepts is never refused, and a bundle
it refuses, where that can be seen offline, is.

A counted matrix of small bundles, each written for one rule. Every case names the CLI source file, or the CLI test,
that decides its verdict (github.com/databricks/cli, read at v1.13.0 and its main branch of 2026-08-21):
- ACCEPTED: `databricks bundle validate` passes them, so `validate` must exit 0; where the CLI warns, or where the
  project has advice, the case names the warning `validate` prints.
- REFUSED: the CLI stops on them with an error, so `validate` must exit 1 with the case's rule, as an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import dedent, indent

import pytest

from distributed_training.tooling.bundle.validate import validate_bundle
from distributed_training.tooling.cli import main

SCHEMA_ENV = "DATABRICKS_BUNDLE_SCHEMA"
ROOT = "bundle: {name: verdicts}\ninclude: [resources/*.yml]\ntargets: {dev: {mode: development, default: true}}\n"
WHEEL_LIBRARY = "libraries: [{whl: ../dist/*.whl}]"
NOTEBOOK = "# Databricks notebook source\nprint('hi')\n"


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, str]  # written over ROOT (databricks.yml) and nothing else
    source: str  # the CLI file or test that decides the verdict
    rule: str | None = None  # ACCEPTED: the warning printed (None: nothing at all); REFUSED: the error
    path: str | None = None  # where the finding points, when the case pins it
    schema: bool = False  # checked against the CLI's JSON schema too (skipped without DATABRICKS_BUNDLE_SCHEMA)
    more_files: dict[str, str] = field(default_factory=dict)  # written as they are (JSON, notebooks)


def root(extra: str = "", base: str = ROOT) -> dict[str, str]:
    """databricks.yml: `base` and then `extra` (YAML, indented as it comes)."""
    return {"databricks.yml": base + dedent(extra)}


def job(body: str) -> dict[str, str]:
    """resources/job.yml holding `body` (YAML under resources:, indented as it comes)."""
    return {"resources/job.yml": "resources:\n" + indent(dedent(body).strip("\n"), "  ") + "\n"}


def cluster_job(cluster: str, task: str = "notebook_task: {notebook_path: ../notebooks/etl.py}") -> dict[str, str]:
    """One job with one job cluster and one task on it."""
    return job(f"""
        jobs:
          etl:
            name: etl
            job_clusters:
              - job_cluster_key: main
                new_cluster: {cluster}
            tasks:
              - task_key: run
                job_cluster_key: main
                {task}
        """)


TRAIN_TASK = ('python_wheel_task: {package_name: example, entry_point: train, parameters: ["--engine", '
              f'"torch_distributor"]}}\n                {WHEEL_LIBRARY}')
GPU = "{spark_version: 17.3.x-gpu-ml-scala2.13, node_type_id: Standard_NC24ads_A100_v4, num_workers: 0, " \
      "is_single_node: true, kind: CLASSIC_PREVIEW, data_security_mode: SINGLE_USER}"
NOTEBOOKS = {"notebooks/etl.py": NOTEBOOK}
SERVERLESS_JOB = """
    jobs:
      train:
        name: train
        environments: [{environment_key: gpu, spec: {environment_version: "4"}}]
        tasks:
          - task_key: train
            environment_key: gpu
            ai_runtime_task:
              experiment: train
              code_source_path: src
              deployments:
                - name: train
                  command_path: ${workspace.file_path}/src/command.sh
                  compute: {accelerator_type: GPU_1xA10, accelerator_count: 1}
    """
SERVERLESS_FILES = {**job(SERVERLESS_JOB), "src/command.sh": "torchrun -m example\n",
                    "src/example/__init__.py": ""}


def serverless(root_targets: str, **changes: str) -> dict[str, str]:
    files = dict(SERVERLESS_FILES)
    text = files["resources/job.yml"]
    for old, new in changes.items():
        text = text.replace(old, new)
    files["resources/job.yml"] = text
    return {**files, "databricks.yml": f"bundle: {{name: verdicts}}\ninclude: [resources/*.yml]\n{root_targets}"}


ACCEPTED = [
    # ---- section 1, cause 1: the guards judge only the clusters that train
    Case("an ETL job cluster of an AWS CPU type outside the catalog", {**cluster_job(
        "{spark_version: 15.4.x-scala2.12, node_type_id: m5.xlarge, num_workers: 2}"), **NOTEBOOKS},
        "bundle/config/validate/job_task_cluster_spec.go (a task needs compute; no node type is refused)"),
    Case("an Azure memory-optimized cluster for a Python file", {**cluster_job(
        "{spark_version: 15.4.x-scala2.12, node_type_id: Standard_E8ds_v5, num_workers: 4}",
        "spark_python_task: {python_file: ../etl.py}"), "etl.py": "print('etl')\n"},
        "bundle/config/validate/job_task_cluster_spec.go"),
    Case("an all-purpose cluster of r5d.8xlarge", job("""
        clusters:
          shared: {spark_version: 15.4.x-scala2.12, node_type_id: r5d.8xlarge, num_workers: 2}
        """), "bundle/config/resources/clusters.go (any node type)"),
    Case("an ETL cluster from a policy that supplies its node type and runtime", {**cluster_job(
        "{policy_id: ABC123, apply_policy_default_values: true, num_workers: 2}"), **NOTEBOOKS},
        "bundle/config/validate/single_node_cluster.go (a policy may supply the settings)"),
    Case("an ETL cluster from an instance pool", {**cluster_job(
        "{instance_pool_id: pool-1, spark_version: 15.4.x-scala2.12, num_workers: 2}"), **NOTEBOOKS},
        "bundle/config/validate/job_task_cluster_spec.go"),
    Case("a training cluster from a policy: not checked offline, a warning", cluster_job(
        "{policy_id: GPU_POLICY, apply_policy_default_values: true, num_workers: 0, is_single_node: true, "
        "kind: CLASSIC_PREVIEW}", TRAIN_TASK),
        "bundle/config/validate/job_task_cluster_spec.go", "cluster-not-checked",
        "resources.jobs.etl.job_clusters[0].new_cluster.node_type_id"),
    # ---- cause 2: severities (libs/dyn/convert/normalize.go, bundle/config/validate/required.go, enum.go)
    Case("a task without task_key", job("""
        jobs:
          etl:
            name: etl
            tasks:
              - existing_cluster_id: abc
                notebook_task: {notebook_path: /Workspace/Shared/etl}
        """), "bundle/config/validate/required.go (warnForMissingFields)", "required-field",
        "resources.jobs.etl.tasks[0]"),
    Case("a job cluster without job_cluster_key", job("""
        jobs:
          etl:
            name: etl
            job_clusters:
              - new_cluster: {spark_version: 15.4.x-scala2.12, node_type_id: m5.xlarge, num_workers: 1}
            tasks:
              - {task_key: run, existing_cluster_id: abc, notebook_task: {notebook_path: /Workspace/Shared/etl}}
        """), "bundle/config/validate/required.go", "required-field", "resources.jobs.etl.job_clusters[0]"),
    Case("a wheel task without entry_point", job(f"""
        jobs:
          etl:
            name: etl
            tasks:
              - task_key: run
                existing_cluster_id: abc
                python_wheel_task: {{package_name: example}}
                {WHEEL_LIBRARY}
        """), "bundle/config/validate/required.go", "required-field",
        "resources.jobs.etl.tasks[0].python_wheel_task"),
    Case("a for_each_task without inputs", job("""
        jobs:
          etl:
            name: etl
            tasks:
              - task_key: each
                for_each_task:
                  task: {task_key: one, existing_cluster_id: abc, notebook_task: {notebook_path: /Workspace/x}}
        """), "bundle/config/validate/required.go", "required-field", "resources.jobs.etl.tasks[0].for_each_task"),
    Case("an unknown field in a task", job("""
        jobs:
          etl:
            name: etl
            tasks:
              - {task_key: run, existing_cluster_id: abc, notebook_task: {notebook_path: /Workspace/x}, retries: 2}
        """), "libs/dyn/convert/normalize.go (\"unknown field\", a warning)", "unknown-field",
        "resources.jobs.etl.tasks[0].retries"),
    Case("an invalid enum value", job("""
        jobs:
          etl:
            name: etl
            tasks:
              - {task_key: run, existing_cluster_id: abc, notebook_task: {notebook_path: /Workspace/x},
                 run_if: SOMETIMES}
        """), "bundle/config/validate/enum.go (a warning)", "invalid-enum", "resources.jobs.etl.tasks[0].run_if"),
    Case("a number where an integer goes, written as text", job("""
        jobs:
          etl: {name: etl, max_concurrent_runs: "2", tasks: [{task_key: run, existing_cluster_id: abc,
                                                           notebook_task: {notebook_path: /Workspace/x}}]}
        """), "libs/dyn/convert/normalize.go (normalizeInt parses \"2\")"),
    # ---- cause 3: fields the CLI's structs have
    Case("a job's id, url and hidden settings fields", job("""
        jobs:
          etl: {name: etl, id: "123", url: "https://x", format: MULTI_TASK, edit_mode: UI_LOCKED,
                tasks: [{task_key: run, existing_cluster_id: abc, notebook_task: {notebook_path: /Workspace/x}}]}
        """), "bundle/config/resources/base.go (BaseResource), bundle/config/resources/job.go (jobs.JobSettings)"),
    Case("a git source's read-only snapshot", job("""
        jobs:
          etl:
            name: etl
            git_source: {git_url: "https://github.com/x/y", git_provider: gitHub, git_branch: main,
                         git_snapshot: {used_commit: abc}}
            tasks: [{task_key: run, existing_cluster_id: abc, notebook_task: {notebook_path: etl}}]
        """), "bundle/config/resources/job.go (the Go SDK's jobs.GitSource has git_snapshot)"),
    # ---- cause 4: variables
    Case("a declaration's value is its value", {**root("""
        variables:
          warehouse: {value: abc}
        """), **job("""
        jobs:
          etl: {name: "${var.warehouse}", tasks: [{task_key: run, existing_cluster_id: abc,
                                                  notebook_task: {notebook_path: /Workspace/x}}]}
        """)}, "bundle/config/mutator/set_variables.go (\"variable already has value initialized\")"),
    Case("${variables.NAME.value} names a variable's value", {**root("""
        variables:
          cluster: {default: abc}
        """), **job("""
        jobs:
          etl: {name: etl, tasks: [{task_key: run, existing_cluster_id: "${variables.cluster.value}",
                                    notebook_task: {notebook_path: /Workspace/x}}]}
        """)}, "bundle/config/mutator/resolve_variable_references.go (var.X is variables.X.value)"),
    Case("a path inside a complex variable resolves from the file that defines it", {
        "databricks.yml": "bundle: {name: verdicts}\ninclude: [resources/*.yml, variables/*.yml]\n"
                          "targets: {dev: {mode: development, default: true}}\n",
        "variables/libraries.yml": "variables:\n  libraries:\n    type: complex\n"
                                   "    default: [{requirements: ./requirements.txt}]\n",
        "variables/requirements.txt": "pandas\n", **job("""
        jobs:
          etl: {name: etl, tasks: [{task_key: run, existing_cluster_id: abc, libraries: "${var.libraries}",
                                    notebook_task: {notebook_path: /Workspace/x}}]}
        """)}, "bundle/config/mutator/translate_paths_test.go (TestTranslatePathWithComplexVariables)"),
    Case("the target's variable-overrides.json gives a variable its value", {**root("""
        variables:
          warehouse: {description: set per target}
        """), **job("""
        jobs:
          etl: {name: "${var.warehouse}", tasks: [{task_key: run, existing_cluster_id: abc,
                                                  notebook_task: {notebook_path: /Workspace/x}}]}
        """)}, "bundle/config/mutator/set_variables.go (readVariablesFromFile)",
        more_files={".databricks/bundle/dev/variable-overrides.json": json.dumps({"warehouse": "abc"})}),
    # ---- cause 5: merging a job cluster keyed by a variable
    Case("a target's job cluster keyed by ${var...} merges with the base entry", {**root("""
        variables:
          cluster_key: {default: main}
        targets:
          dev:
            resources:
              jobs:
                etl:
                  job_clusters:
                    - job_cluster_key: ${var.cluster_key}
                      new_cluster: {node_type_id: Standard_NC48ads_A100_v4}
        """, base="bundle: {name: verdicts}\ninclude: [resources/*.yml]\n"), **cluster_job(GPU, TRAIN_TASK)},
        "bundle/config/mutator/resourcemutator/resource_mutator.go (MergeJobClusters after the resolver)"),
    # ---- cause 6: paths
    Case("a pipeline library glob matches notebooks", {**job("""
        pipelines:
          etl: {name: etl, libraries: [{notebook: {path: ../notebooks/*.py}}]}
        """), "notebooks/a.py": NOTEBOOK, "notebooks/b.py": NOTEBOOK},
        "bundle/config/mutator/resourcemutator/expand_pipeline_glob_paths.go"),
    Case("a code_source_path an artifact builds", {**serverless(
        "targets: {dev: {mode: development, default: true, presets: {source_linked_deployment: false}}}\n"
        "artifacts: {code: {build: tar czf code.tgz src, files: [{source: code.tgz}]}}\n",
        **{"code_source_path: src": "code_source_path: code.tgz"})},
        "bundle/config/mutator/aicode/validate_test.go (TestValidateNonDirectoryCodeSourceIsSkipped)"),
    # ---- cause 7: YAML
    Case("a repeated plain key keeps the later value", job("""
        jobs:
          etl:
            name: first
            name: second
            tasks: [{task_key: run, existing_cluster_id: abc, notebook_task: {notebook_path: /Workspace/x}}]
        """), "libs/dyn/yamlloader/loader.go (loadMapping sets each key; the later one wins)", "duplicate-key",
        "resources.jobs.etl.name"),
    # ---- cause 8: what the JSON schema refuses and the CLI's loader accepts
    Case("an empty target, an empty run_as and an empty tasks list with the schema", {
        "databricks.yml": "bundle: {name: verdicts}\ninclude: [resources/*.yml]\nrun_as:\n"
                          "targets:\n  dev:\n  prod:\n    mode: production\n"
                          "    workspace: {root_path: /Workspace/Shared/verdicts}\n", **job("""
        jobs:
          etl: {name: etl, tasks: }
        """)}, "acceptance/bundle/run_as/empty_run_as (\"Validation OK!\"), libs/dyn/convert/normalize.go "
               "(a null struct, map or list is kept as absent)", schema=True),
    Case("a bundle name written as a number", {"databricks.yml": "bundle: {name: 1234}\n"},
         "libs/dyn/convert/normalize.go (normalizeString reads 1234 as \"1234\")", schema=True),
    # ---- other verdicts the CLI leaves to the platform
    Case("Spark's ${env:...} in a cluster's spark_conf is text, not a reference", {**cluster_job(
        '{spark_version: 15.4.x-scala2.12, node_type_id: m5.xlarge, num_workers: 1, '
        'spark_conf: {spark.executorEnv.HOME: "${env:HOME}"}}'), **NOTEBOOKS},
        "libs/dyn/dynvar/ref.go (no match: left as it is)", "invalid-reference"),
    Case("a production target without root_path whose jobs all run as a service principal", {
        "databricks.yml": "bundle: {name: verdicts}\ninclude: [resources/*.yml]\n"
                          "run_as: {service_principal_name: sp-1}\ntargets: {prod: {mode: production}}\n", **job("""
        jobs:
          etl: {name: etl, tasks: [{task_key: run, existing_cluster_id: abc,
                                    notebook_task: {notebook_path: /Workspace/x}}]}
        """)}, "bundle/config/mutator/resourcemutator/validate_target_mode.go (a recommendation when run_as is set)",
        "production-without-root-path", "targets.prod"),
    Case("num_workers: 0 without the single-node settings", {**cluster_job(
        "{spark_version: 15.4.x-scala2.12, node_type_id: m5.xlarge, num_workers: 0}"), **NOTEBOOKS},
        "bundle/config/validate/single_node_cluster.go (a warning)", "single-node-incomplete"),
    Case("is_single_node: true without kind", {**cluster_job(
        "{spark_version: 15.4.x-scala2.12, node_type_id: m5.xlarge, num_workers: 0, is_single_node: true}"),
        **NOTEBOOKS}, "bundle/config/validate/single_node_cluster.go (is_single_node: true needs nothing more)"),
    Case("run_as the deployer beside a model serving endpoint", {
        "databricks.yml": ROOT + "run_as: {user_name: '${workspace.current_user.userName}'}\n", **job("""
        model_serving_endpoints:
          serve: {name: serve}
        """)}, "bundle/config/mutator/resourcemutator/run_as.go (the deployer's own identity is always allowed)"),
    Case("run_as a service principal beside a model serving endpoint: refused unless it deploys", {
        "databricks.yml": ROOT + "run_as: {service_principal_name: sp-1}\n", **job("""
        model_serving_endpoints:
          serve: {name: serve}
        """)}, "acceptance/bundle/run_as/model_serving_different (an error unless sp-1 deploys)",
        "run-as-unsupported", "resources.model_serving_endpoints"),
    # ---- issue 33: source-linked deployment
    Case("a local code_source_path with source-linked deployment off", serverless(
        "targets: {dev: {mode: development, default: true, presets: {source_linked_deployment: false}}}\n"),
        "bundle/config/mutator/apply_source_linked_deployment_preset.go:26 (an explicit false stays off)"),
    Case("a local code_source_path in a development target left to its default", serverless(
        "targets: {dev: {mode: development, default: true}}\n"),
        "bundle/config/mutator/apply_source_linked_deployment_preset.go:70 (on by default in development mode on "
        "Databricks compute), aicode/validate.go:210", "code-source-with-source-linked",
        "resources.jobs.train.tasks[0].ai_runtime_task.code_source_path"),
    Case("a local code_source_path in a production target left to its default", serverless(
        "targets: {prod: {mode: production, workspace: {root_path: /Workspace/Shared/x}}}\n"),
        "bundle/config/mutator/apply_source_linked_deployment_preset.go:70 (development mode only)"),
    Case("a production target without root_path, and a job without run_as (a principal may deploy it)", {
        "databricks.yml": "bundle: {name: verdicts}\ninclude: [resources/*.yml]\ntargets: {prod: {mode: production}}\n",
        **job("""
        jobs:
          etl: {name: etl, tasks: [{task_key: run, existing_cluster_id: abc,
                                    notebook_task: {notebook_path: /Workspace/x}}]}
        """)},
        "bundle/config/mutator/resourcemutator/validate_target_mode.go (validateProductionMode: an error when a user "
        "deploys it, a recommendation when a service principal does; who deploys is unknown offline)",
        "production-without-root-path", "targets.prod"),
]

REFUSED = [
    Case("a second merge key in one mapping", {**root("""
        defaults: &defaults {timeout_seconds: 60}
        more: &more {max_retries: 1}
        resources:
          jobs:
            etl:
              name: etl
              <<: *defaults
              <<: *more
        """)}, "libs/dyn/yamlloader/loader.go (\"duplicate YAML merge key\")", "duplicate-merge-key",
        "resources.jobs.etl"),
    Case("run_as names no identity", {**root("run_as: {}\n")},
         "acceptance/bundle/run_as/empty_run_as_dict", "run-as-identity", "run_as"),
    Case("run_as names empty identities", {**root("run_as: {service_principal_name: ''}\n")},
         "acceptance/bundle/run_as/empty_sp", "run-as-identity", "run_as"),
    Case("run_as names a user and a service principal", {
        "databricks.yml": ROOT + "run_as: {user_name: a@b.c, service_principal_name: sp-1}\n"},
        "acceptance/bundle/run_as/invalid_both_sp_and_user", "run-as-identity", "run_as"),
    Case("workspace.root_path in a volume", {**root("workspace: {root_path: /Volumes/a/b/c}\n")},
         "bundle/config/validate/validate_volume_path.go", "workspace-path-in-volume", "workspace.root_path"),
    Case("workspace.file_path in a volume", {**root("workspace: {file_path: /Volumes/a/b/c}\n")},
         "bundle/config/validate/validate_volume_path.go", "workspace-path-in-volume", "workspace.file_path"),
    Case("a dashboard without warehouse_id", job("""
        dashboards:
          sales: {display_name: Sales, file_path: ../sales.lvdash.json}
        """) | {"sales.lvdash.json": "{}"}, "bundle/config/validate/required.go (errorForMissingFields)",
        "required-resource-field", "resources.dashboards.sales"),
    Case("a dashboard without display_name", job("""
        dashboards:
          sales: {warehouse_id: abc, file_path: ../sales.lvdash.json}
        """) | {"sales.lvdash.json": "{}"}, "bundle/config/validate/required.go (errorForMissingFields)",
        "required-resource-field", "resources.dashboards.sales"),
    Case("a dashboard with an etag", job("""
        dashboards:
          sales: {display_name: Sales, warehouse_id: abc, etag: "1", file_path: ../sales.lvdash.json}
        """) | {"sales.lvdash.json": "{}"}, "bundle/config/validate/validate_dashboard_etags.go",
        "cli-managed-field", "resources.dashboards.sales.etag"),
    Case("a Genie space with both file_path and serialized_space", job("""
        genie_spaces:
          ask: {title: Ask, warehouse_id: abc, file_path: ../ask.json, serialized_space: "{}"}
        """) | {"ask.json": "{}"},
        "bundle/config/mutator/resourcemutator/configure_genie_space_serialized_space.go (\"specify only one\")",
        "genie-space-content", "resources.genie_spaces.ask.serialized_space"),
    Case("a Genie space with an etag", job("""
        genie_spaces:
          ask: {title: Ask, warehouse_id: abc, serialized_space: "{}", etag: "2"}
        """), "bundle/config/validate/validate_genie_space_etags.go", "cli-managed-field",
        "resources.genie_spaces.ask.etag"),
    Case("a SQL warehouse with a blank name", job("""
        sql_warehouses:
          wh: {name: "  ", cluster_size: Small}
        """), "bundle/config/validate/required.go (\"sql_warehouse name is required\")", "required-resource-field",
        "resources.sql_warehouses.wh"),
    Case("a grant without a principal", job("""
        schemas:
          s: {name: s, catalog_name: main, grants: [{privileges: [USE_SCHEMA]}]}
        """), "bundle/config/validate/required.go (errorForInvalidGrants)", "grant-incomplete",
        "resources.schemas.s.grants[0]"),
    Case("a grant without privileges", job("""
        schemas:
          s: {name: s, catalog_name: main, grants: [{principal: data-team, privileges: []}]}
        """), "bundle/config/validate/required.go (errorForInvalidGrants)", "grant-incomplete",
        "resources.schemas.s.grants[0]"),
    Case("a job that sets its deployment id", job("""
        jobs:
          etl: {name: etl, deployment: {kind: BUNDLE, deployment_id: x},
                tasks: [{task_key: run, existing_cluster_id: abc, notebook_task: {notebook_path: /Workspace/x}}]}
        """), "bundle/config/validate/validate_deployment_fields.go", "cli-managed-field",
        "resources.jobs.etl.deployment.deployment_id"),
    Case("artifact files that match nothing, with no build", {**root("""
        artifacts:
          wheel: {type: whl, files: [{source: dist/*.whl}]}
        """)}, "bundle/artifacts/expand_globs.go (\"no matching files\")", "artifact-file-missing",
        "artifacts.wheel.files[0].source"),
    Case("an artifact left empty", {**root("artifacts:\n  wheel:\n")},
         "bundle/artifacts/prepare.go (\"Artifact not properly configured\")", "artifact-incomplete",
         "artifacts.wheel"),
    Case("an artifact with neither build nor files", {**root("artifacts: {jar: {type: jar}}\n")},
         "bundle/artifacts/prepare.go (\"misconfigured artifact\")", "artifact-incomplete", "artifacts.jar"),
    Case("a script with the key of a job", {**root("scripts: {etl: {content: echo hi}}\n"),
                                            **job("""
        jobs:
          etl: {name: etl, tasks: [{task_key: run, existing_cluster_id: abc,
                                    notebook_task: {notebook_path: /Workspace/x}}]}
        """)}, "bundle/config/validate/unique_resource_keys.go", "script-key-taken", "scripts.etl"),
    Case("a script without content", {**root("scripts: {hello: {env: {A: b}}}\n")},
         "bundle/config/validate/scripts.go (\"has no content\")", "script-content", "scripts.hello.content"),
    Case("a script whose content holds ${...}", {**root("scripts: {hello: {content: "
                                                 "'echo ${bundle.name}'}}\n")},
         "bundle/config/validate/scripts.go (validateScriptContent)", "script-content", "scripts.hello.content"),
    Case("a script env from a resource id", {**root("scripts: {hello: {content: echo $ID, env: "
                                             "{ID: '${resources.jobs.etl.id}'}}}\n")},
         "bundle/config/validate/scripts.go (validateScriptEnv)", "script-env-reference", "scripts.hello.env.ID"),
    Case("a target assigns a variable the bundle does not declare", {
        "databricks.yml": "bundle: {name: verdicts}\ntargets: {dev: {variables: {warehouse: abc}}}\n"},
        "bundle/config/root.go (validateVariableOverrides)", "undeclared-target-variable",
        "targets.dev.variables.warehouse"),
    Case("a target mode the CLI does not know", {"databricks.yml": "bundle: {name: verdicts}\n"
                                                 "targets: {dev: {mode: staging}}\n"},
         "bundle/config/mutator/resourcemutator/validate_target_mode.go", "unsupported-mode", "targets.dev.mode"),
    Case("a local code_source_path with source-linked deployment on", serverless(
        "targets: {dev: {mode: development, default: true, presets: {source_linked_deployment: true}}}\n"),
        "bundle/config/mutator/aicode/validate.go:210, validate_test.go (TestValidateSourceLinkedConflict)",
        "code-source-with-source-linked", "resources.jobs.train.tasks[0].ai_runtime_task.code_source_path"),
    Case("a code_source_path outside the bundle", serverless(
        "targets: {dev: {presets: {source_linked_deployment: false}}}\n",
        **{"code_source_path: src": "code_source_path: ../shared"}),
        "bundle/config/mutator/aicode/validate_test.go (TestValidateCodeSourceOutsideBundleRoot)",
        "code-source-outside-bundle"),
    Case("a local code_source_path with git_source", serverless(
        "targets: {dev: {presets: {source_linked_deployment: false}}}\n",
        **{"      name: train\n": "      name: train\n      git_source: {git_url: 'https://github.com/x/y', "
                                  "git_provider: gitHub, git_branch: main}\n"}),
        "bundle/config/mutator/aicode/validate_test.go (TestValidateGitSourceConflict)",
        "code-source-with-git-source"),
    Case("a resource left empty", {**root("resources:\n  jobs:\n    etl:\n")},
         "bundle/config/validate/all_resources_have_values.go (\"job etl is not defined\")", "resource-not-defined",
         "resources.jobs.etl"),
    Case("a variable with no value anywhere", {**root("variables: {warehouse: {description: x}}\n")},
         "bundle/config/mutator/set_variables.go (\"no value assigned to required variable\")",
         "variable-without-value", "variables.warehouse"),
    Case("a variable-overrides.json that is not JSON", {"databricks.yml": ROOT},
         "bundle/config/mutator/set_variables.go (readVariablesFromFile)", "variable-overrides-unreadable",
         more_files={".databricks/bundle/dev/variable-overrides.json": "{not json"}),
    Case("a pipeline library glob that matches nothing", job("""
        pipelines:
          etl: {name: etl, libraries: [{notebook: {path: ../notebooks/*.py}}]}
        """), "bundle/config/mutator/resourcemutator/expand_pipeline_glob_paths.go (kept as written), "
              "translate_paths.go", "local-path-missing", "resources.pipelines.etl.libraries[0].notebook.path"),
    Case("a pipeline library glob that matches a file that is no notebook", {**job("""
        pipelines:
          etl: {name: etl, libraries: [{notebook: {path: ../notebooks/*.py}}]}
        """), "notebooks/a.py": NOTEBOOK, "notebooks/b.py": "print('plain')\n"},
        "bundle/config/mutator/resourcemutator/expand_pipeline_glob_paths.go, translate_paths.go",
        "local-path-wrong-kind", "resources.pipelines.etl.libraries[0].notebook.path"),
]
# The matrix only grows: cases are added as verdicts are found, not removed.
MIN_ACCEPTED, MIN_REFUSED = 35, 32


def write(folder: Path, case: Case) -> Path:
    for name, text in {"databricks.yml": ROOT, **case.files}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(dedent(text))
    for name, text in case.more_files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def findings_of(folder: Path, case: Case, schema: str | None) -> list:
    report = validate_bundle(folder, schema_path=schema if case.schema else None)
    return list(dict.fromkeys(finding for findings in report.values() for finding in findings))


def test_the_matrix_is_counted_and_every_case_names_its_cli_source():
    assert len(ACCEPTED) >= MIN_ACCEPTED and len(REFUSED) >= MIN_REFUSED, (len(ACCEPTED), len(REFUSED))
    names = [case.name for case in ACCEPTED + REFUSED]
    assert len(set(names)) == len(names)
    assert all(case.source and case.rule for case in REFUSED)
    assert all(case.source.startswith(("bundle/", "libs/", "acceptance/")) for case in ACCEPTED + REFUSED)


@pytest.mark.parametrize("case", ACCEPTED, ids=[case.name for case in ACCEPTED])
def test_a_bundle_the_cli_accepts_passes(case, tmp_path, capsys, monkeypatch):
    schema = __import__("os").environ.get(SCHEMA_ENV)
    if case.schema and not schema:
        pytest.skip(f"set {SCHEMA_ENV} to the bundle JSON schema")
    findings = findings_of(write(tmp_path, case), case, schema)
    assert [str(finding) for finding in findings if finding.is_error] == []
    warned = {(finding.rule, finding.path) for finding in findings}
    if case.rule is None:
        assert {rule for rule, _ in warned} <= ({"schema"} if case.schema else set()), warned
    else:
        assert {rule for rule, _ in warned} == {case.rule}, warned
        assert case.path is None or (case.rule, case.path) in warned, warned
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert main(["validate", str(tmp_path)]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("case", REFUSED, ids=[case.name for case in REFUSED])
def test_a_bundle_the_cli_refuses_fails_for_its_reason(case, tmp_path, capsys, monkeypatch):
    findings = findings_of(write(tmp_path, case), case, None)
    errors = {(finding.rule, finding.path) for finding in findings if finding.is_error}
    assert case.rule in {rule for rule, _ in errors}, [str(finding) for finding in findings]
    assert case.path is None or (case.rule, case.path) in errors, errors
    assert all(finding.fix for finding in findings)
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert main(["validate", str(tmp_path)]) == 1
    capsys.readouterr()
