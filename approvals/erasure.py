"""Erasing a person from the approvals app's rows: what their runs asked people (the content
under review, a task's form and answer, the comment), the audit of decision attempts, and
the Slack clicks on those requests (docs/how-to/erase-a-person.md). Who decided (a
colleague, not the person erased) stays.

A pending request whose content lost a value is bound to its content as it now is (its
``digest`` computed again): a run that finishes without the data can still be decided, on
what a person now sees; a Slack button posted with the old content is refused
(``content_changed``), as for any content that changed under it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from workflows.plugins.engine import fetch_dicts
from workflows.plugins.erasure import Counts, Erasing, add_counts, scrub_rows

from . import sql
from .services import content_digest

# approvers and escalate_to: a template may have rendered a person's address there.
REQUEST_COLUMNS = ["content", "answer", "comment", "approvers", "escalate_to"]


def erase_approvals(cursor: Any, erasing: Erasing) -> Mapping[str, int]:
    params = erasing.params()
    counts: Counts = {}
    if erasing.run_ids:
        for table, columns, where in (
            ("approvals_approvalrequest", REQUEST_COLUMNS, sql.REQUESTS_OF_RUNS),
            ("approvals_decisionattempt", ["detail"], sql.ATTEMPTS_OF_RUNS),
            ("approvals_slackinteraction", ["token", "response_url", "reply"],
             sql.INTERACTIONS_OF_RUNS),
        ):  # fmt: skip
            scrubbed = scrub_rows(cursor, erasing.matcher, table=table, columns=columns,
                                  where=where, params=params, widen=erasing.widen)  # fmt: skip
            add_counts(counts, scrubbed)
        _rebind_pending(cursor, params)
    if erasing.org_wide:
        for table, columns, where in (
            ("approvals_decisionattempt", ["detail"], sql.ATTEMPTS_OF_ORG),
            ("approvals_slackinteraction", ["token", "response_url", "reply"],
             sql.INTERACTIONS_OF_ORG),
        ):  # fmt: skip
            add_counts(counts, scrub_rows(cursor, erasing.matcher, table=table, columns=columns,
                                          where=where, params=params,
                                          widen=erasing.widen))  # fmt: skip
    return counts


def _rebind_pending(cursor: Any, params: Mapping[str, Any]) -> None:
    cursor.execute(sql.PENDING_CONTENT_OF_RUNS, params)
    for row in fetch_dicts(cursor):
        digest = content_digest(json.loads(row["content"]))
        if digest != row["digest"]:
            cursor.execute(sql.REBIND_DIGEST, {"id": row["id"], "digest": digest})
