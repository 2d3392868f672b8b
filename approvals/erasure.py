"""Erasing a person from the approvals app's rows: what their runs asked people (the content
under review, a task's form and answer, the comment), the audit of decision attempts, and
the Slack clicks on those requests (docs/operations.md, "Erasing a person"). Who decided (a
colleague, not the person erased) stays.

The request's ``digest`` (sha256 of the content as it was asked) stays: it binds a decision
to what was reviewed, and is no copy of the content.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.plugins.erasure import Counts, Erasing, scrub_rows

from . import sql

REQUEST_COLUMNS = ["content", "answer", "comment"]


def erase_approvals(cursor: Any, erasing: Erasing) -> Mapping[str, int]:
    params = erasing.params()
    counts: Counts = {}
    if erasing.run_ids:
        for table, columns, where in (
            ("approvals_approvalrequest", REQUEST_COLUMNS, sql.REQUESTS_OF_RUNS),
            ("approvals_decisionattempt", ["detail"], sql.ATTEMPTS_OF_RUNS),
            (
                "approvals_slackinteraction",
                ["token", "response_url", "reply"],
                sql.INTERACTIONS_OF_RUNS,
            ),
        ):
            counts.update(
                scrub_rows(
                    cursor,
                    erasing.matcher,
                    table=table,
                    columns=columns,
                    where=where,
                    params=params,
                    widen=erasing.widen,
                )
            )
    if erasing.org_wide:
        counts.update(
            scrub_rows(
                cursor,
                erasing.matcher,
                table="approvals_decisionattempt",
                columns=["detail"],
                where=sql.ATTEMPTS_OF_ORG,
                params=params,
                widen=erasing.widen,
            )
        )
    return counts
