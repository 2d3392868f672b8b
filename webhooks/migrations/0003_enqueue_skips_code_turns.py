"""The trigger that queues deliveries skips a code run's turns failing: a ``code`` step's
``step.failed`` is the engine's own step, not one the workflow called (the run's
``run.failed``, or the called step's own ``step.failed``, says what failed). A new version of
the function (webhooks_enqueue_v2), the trigger moved to it; frozen here, as this migration
ran it (webhooks/sql.py holds the current text)."""

from django.db import migrations

ENQUEUE_V2 = """
DROP TRIGGER IF EXISTS webhooks_enqueue ON workflows_runevent;
CREATE OR REPLACE FUNCTION webhooks_enqueue_v2() RETURNS trigger
LANGUAGE plpgsql AS $function$
DECLARE
    v_type text := CASE
        WHEN NEW.kind <> 'step.waiting' THEN NEW.kind
        WHEN NEW.detail ? 'approval' THEN 'approval.requested'
        ELSE 'task.requested' END;
    v_run jsonb;
    v_data jsonb;
BEGIN
    PERFORM 1 FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NEW.kind = 'step.failed' AND EXISTS (
        SELECT 1 FROM workflows_step st
         WHERE st.run_id = NEW.run_id AND st.step_id = NEW.step_id
           AND st.iteration = NEW.iteration AND st.type = 'code') THEN
        -- A code run's turn (workflows/code): the engine's own step, not one the workflow
        -- called; what failed it is the run's run.failed, or the called step's step.failed.
        RETURN NULL;
    END IF;
    SELECT jsonb_build_object('id', r.id, 'automation', a.slug, 'version', v.number,
                              'start_key', r.start_key)
      INTO v_run
      FROM workflows_run r
      JOIN workflows_automation a ON a.id = r.automation_id
      JOIN workflows_automationversion v ON v.id = r.version_id
     WHERE r.id = NEW.run_id;
    v_data := jsonb_build_object('run', v_run,
                                 'detail', COALESCE(NEW.detail, '{}'::jsonb) - 'version_id')
           || CASE WHEN NEW.step_id <> ''
                   THEN jsonb_build_object('step', jsonb_build_object(
                            'id', NEW.step_id, 'iteration', NEW.iteration,
                            'attempt', NEW.attempt))
                   ELSE '{}'::jsonb END;
    INSERT INTO webhooks_delivery (org_id, subscription_id, event_id, event_type, run_id,
                                   payload, occurred_at, status, attempts, next_at, token,
                                   last_error, last_response, created_at)
    SELECT NEW.org_id, s.id, NEW.id, v_type, NEW.run_id, v_data, NEW.at, 'pending', 0, now(),
           '', '', '', now()
      FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    RETURN NULL;
END
$function$;

CREATE TRIGGER webhooks_enqueue
 AFTER INSERT ON workflows_runevent
 FOR EACH ROW WHEN (
     NEW.kind IN ('run.started', 'run.succeeded', 'run.failed', 'run.cancelled',
                  'run.compensated', 'step.failed', 'effect.needs_review')
     OR (NEW.kind = 'step.waiting' AND (NEW.detail ? 'approval' OR NEW.detail ? 'task')))
 EXECUTE FUNCTION webhooks_enqueue_v2();
DROP FUNCTION IF EXISTS webhooks_enqueue_v1();
"""

# Back to 0002's state: the first function, its trigger with 0002's WHEN clause.
ENQUEUE_V1 = """
DROP TRIGGER IF EXISTS webhooks_enqueue ON workflows_runevent;
CREATE OR REPLACE FUNCTION webhooks_enqueue_v1() RETURNS trigger
LANGUAGE plpgsql AS $function$
DECLARE
    v_type text := CASE
        WHEN NEW.kind <> 'step.waiting' THEN NEW.kind
        WHEN NEW.detail ? 'approval' THEN 'approval.requested'
        ELSE 'task.requested' END;
    v_run jsonb;
    v_data jsonb;
BEGIN
    PERFORM 1 FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT jsonb_build_object('id', r.id, 'automation', a.slug, 'version', v.number,
                              'start_key', r.start_key)
      INTO v_run
      FROM workflows_run r
      JOIN workflows_automation a ON a.id = r.automation_id
      JOIN workflows_automationversion v ON v.id = r.version_id
     WHERE r.id = NEW.run_id;
    v_data := jsonb_build_object('run', v_run,
                                 'detail', COALESCE(NEW.detail, '{}'::jsonb) - 'version_id')
           || CASE WHEN NEW.step_id <> ''
                   THEN jsonb_build_object('step', jsonb_build_object(
                            'id', NEW.step_id, 'iteration', NEW.iteration,
                            'attempt', NEW.attempt))
                   ELSE '{}'::jsonb END;
    INSERT INTO webhooks_delivery (org_id, subscription_id, event_id, event_type, run_id,
                                   payload, occurred_at, status, attempts, next_at, token,
                                   last_error, last_response, created_at)
    SELECT NEW.org_id, s.id, NEW.id, v_type, NEW.run_id, v_data, NEW.at, 'pending', 0, now(),
           '', '', '', now()
      FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    RETURN NULL;
END
$function$;

CREATE TRIGGER webhooks_enqueue
 AFTER INSERT ON workflows_runevent
 FOR EACH ROW WHEN (
     NEW.kind IN ('run.started', 'run.succeeded', 'run.failed', 'run.cancelled',
                  'run.compensated', 'step.failed', 'effect.needs_review')
     OR (NEW.kind = 'step.waiting' AND (NEW.detail ? 'approval' OR NEW.detail ? 'task')))
 EXECUTE FUNCTION webhooks_enqueue_v1();
DROP FUNCTION IF EXISTS webhooks_enqueue_v2();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0002_enqueue_run_compensated"),
        ("workflows", "0032_deferrals_carry_their_code"),
    ]

    operations = [
        migrations.RunSQL(sql=ENQUEUE_V2, reverse_sql=ENQUEUE_V1),
    ]
