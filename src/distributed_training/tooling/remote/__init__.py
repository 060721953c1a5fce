"""Run a deployed job in the workspace and follow it to its end: the `run` command and what it is made of.

`deployment` finds the job `databricks bundle deploy` created (local deployment state, else the Jobs API and the
tags every generated job carries); `retry_policy` rides out transient API errors; `run_state` reads a run's state;
`progress` shows it as it changes; `follow` polls until the run ends or the wait is over; `report` says why a run
did not succeed; `run` is the command itself.
"""
