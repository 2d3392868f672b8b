"""Workflows written as Python code, on the same engine as definitions
(docs/reference/code-workflows.md).

A host registers a function with ``@workflow(name, version=N)`` (registry.py); publishing it
(publish.py) makes an ordinary automation whose one step is a ``code`` step (steptypes.py),
so runs start through the ordinary start path. That step, on a worker, runs the function
from the top with a ``Context`` (context.py) that hands back the results the run recorded
and stops at the first step with no result yet; the engine enters that step as it enters a
definition's (engine/decided.py), and when it ends, the ``code`` step decides again.
Approvals, tasks and the waits on the clock are Context's calls from people_and_time.py;
the input and output are checked against the workflow's schemas (schemas.py), given or
read from its TypedDict hints (type_hints.py).
"""
