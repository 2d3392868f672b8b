"""The server-side functions and triggers the migrations built are exactly the current ones.

Each migration that installs a function or trigger runs its own frozen copy of the SQL; the
runtime homes (workflows/engine/sql/functions.py, timers/sql.py for the trigger the timers
app puts on the engine's steps, webhooks/sql.py for the one the webhooks app puts on its run
history) hold each one's current text and nothing else. The
test database is built by the migrations; this test reads its functions and triggers as
PostgreSQL describes them (pg_get_functiondef, pg_get_triggerdef), then, in a transaction it
rolls back, drops them all, installs the runtime homes' texts instead and reads them again.
The two readings must be equal (whitespace aside): a function in the database that the
homes lack, a version the homes keep after a migration dropped it, or a frozen text that
differs from the current one all fail it, by name.
"""

from __future__ import annotations

import difflib
from types import ModuleType

import pytest
from django.db import connection, transaction

from timers import sql as timers_sql
from webhooks import sql as webhooks_sql
from workflows.engine.sql import functions

HOMES: tuple[ModuleType, ...] = (functions, timers_sql, webhooks_sql)

# The app's functions: every one in its schema but an extension's, and any named waymark_*.
# (pg_get_functiondef describes functions and procedures; anything else is named by kind.)
FUNCTIONS = r"""
SELECT 'function ' || p.oid::regprocedure::text,
       CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
            ELSE 'prokind ' || p.prokind::text END
  FROM pg_proc p
 WHERE (p.pronamespace = current_schema()::regnamespace
        AND NOT EXISTS (SELECT FROM pg_depend d
                         WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                           AND d.deptype = 'e'))
    OR p.proname LIKE 'waymark\_%'
"""

# Triggers written by hand (not the ones PostgreSQL makes for foreign keys) on its tables.
TRIGGERS = """
SELECT 'trigger ' || t.tgname || ' on ' || t.tgrelid::regclass::text, pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
"""


def current_texts() -> dict[str, str]:
    """Every SQL text the homes hold that creates something, by its constant's name."""
    return {
        f"{home.__name__}.{name}": value
        for home in HOMES
        for name, value in vars(home).items()
        if name.isupper() and isinstance(value, str) and value.lstrip().startswith("CREATE")
    }


def catalog() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(FUNCTIONS)
        rows = cursor.fetchall()
        cursor.execute(TRIGGERS)
        rows += cursor.fetchall()
    return dict(rows)


def drop_all(objects: dict[str, str]) -> None:
    """Drop the triggers, then the functions (CASCADE: an index over one goes with it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass)"
            "  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace"
        )
        drops = [row[0] for row in cursor.fetchall()]
        drops += [
            f"DROP FUNCTION {key.removeprefix('function ')} CASCADE"
            for key in objects
            if key.startswith("function ")
        ]
        for drop in drops:
            cursor.execute(drop)


def installed_from_homes(migrated: dict[str, str]) -> dict[str, str]:
    """The catalog as the homes' texts alone make it; rolled back, so the database stays
    as the migrations built it."""
    with transaction.atomic():
        drop_all(migrated)
        with connection.cursor() as cursor:
            for text in current_texts().values():
                cursor.execute(text)
        expected = catalog()
        transaction.set_rollback(True)
    return expected


def normalised(text: str) -> str:
    return " ".join(text.split())


def differences(migrated: dict[str, str], expected: dict[str, str]) -> list[str]:
    found = []
    for key in sorted(migrated.keys() - expected.keys()):
        found.append(f"{key}: in the migrated database, not in the runtime homes")
    for key in sorted(expected.keys() - migrated.keys()):
        found.append(f"{key}: in the runtime homes, not in the migrated database")
    for key in sorted(migrated.keys() & expected.keys()):
        if normalised(migrated[key]) != normalised(expected[key]):
            diff = difflib.unified_diff(
                expected[key].splitlines(),
                migrated[key].splitlines(),
                "runtime home",
                "migrated",
                lineterm="",
            )
            found.append(f"{key}: differs\n" + "\n".join(diff))
    return found


@pytest.mark.django_db
def test_the_migrated_functions_and_triggers_are_the_current_ones() -> None:
    migrated = catalog()
    expected = installed_from_homes(migrated)

    found = differences(migrated, expected)
    if found:
        pytest.fail("\n\n".join(found), pytrace=False)
    # The check saw what it is about (an empty catalog would pass it), and left it in place.
    assert "function waymark_settle_hops_v3(jsonb)" in migrated
    assert "trigger timers_cancel_with_step on workflows_step" in migrated
    assert catalog() == migrated
    with connection.cursor() as cursor:
        cursor.execute("SELECT FROM pg_indexes WHERE indexname = 'signal_pending_keys'")
        assert cursor.rowcount == 1


@pytest.mark.django_db
def test_the_check_names_what_differs() -> None:
    migrated = catalog()
    changed = "function waymark_signal_keys_v1(bigint,text,text,text[])"
    homes = {**migrated, changed: migrated[changed].replace("'/'", "':'")}
    lacking = "trigger timers_cancel_with_step on workflows_step"
    del homes[lacking]

    found = differences(migrated, homes)

    assert len(found) == 2
    assert found[0] == f"{lacking}: in the migrated database, not in the runtime homes"
    assert found[1].startswith(f"{changed}: differs\n")
    assert "':'" in found[1]
