"""`advise`: single node or several, which engine, which node type and how many, from model and data size.

`memory` estimates the memory per GPU; `search` tries the setups in the platform's order and says why one holds the
job; `plan` holds what it answers with (the job, the plan, the advice and its JSON form); `report` writes the advice
as text; `command` is the command line.
"""
