"""Retention deletes finished runs and their steps with raw SQL (workflows knows nothing of
approvals): the database deletes their approval requests with them, and a request's decision
attempts (the audit) with the request. Before this, any run that ever had an approval could
not be purged (a foreign key violation), and every later purge batch holding it failed too.

- ``approvals_approvalrequest.run_id`` -> ``workflows_run``: ON DELETE CASCADE.
- ``approvals_approvalrequest.step_row_id`` -> ``workflows_step``: ON DELETE CASCADE. A step
  row is only ever deleted with its run (retention deletes the steps, then the run, in one
  transaction), so the request lives exactly as long as its run either way; SET NULL would
  only keep, for the instant between the two deletes, a request without its step.
- ``approvals_decisionattempt.approval_id`` -> ``approvals_approvalrequest``: ON DELETE
  CASCADE. An attempt's audit row lives as long as its approval; attempts that were never
  tied to an approval (``approval_id`` NULL) are not touched.

All three stay DEFERRABLE INITIALLY DEFERRED, as Django creates them. Like
effects/0002 and timers/0002: a migration of its own because Django adds the foreign keys at
the end of the migration that creates the tables.
"""

from django.db import migrations

FORWARD = """
DO $$
DECLARE fk text;
BEGIN
    FOR fk IN SELECT conname FROM pg_constraint
               WHERE conrelid = 'approvals_approvalrequest'::regclass AND contype = 'f'
                 AND confrelid IN ('workflows_run'::regclass, 'workflows_step'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE approvals_approvalrequest DROP CONSTRAINT %I', fk);
    END LOOP;
    FOR fk IN SELECT conname FROM pg_constraint
               WHERE conrelid = 'approvals_decisionattempt'::regclass AND contype = 'f'
                 AND confrelid = 'approvals_approvalrequest'::regclass
    LOOP
        EXECUTE format('ALTER TABLE approvals_decisionattempt DROP CONSTRAINT %I', fk);
    END LOOP;
    ALTER TABLE approvals_approvalrequest ADD CONSTRAINT approvals_request_run_cascade
        FOREIGN KEY (run_id) REFERENCES workflows_run (id)
        ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
    ALTER TABLE approvals_approvalrequest ADD CONSTRAINT approvals_request_step_cascade
        FOREIGN KEY (step_row_id) REFERENCES workflows_step (id)
        ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
    ALTER TABLE approvals_decisionattempt ADD CONSTRAINT approvals_attempt_approval_cascade
        FOREIGN KEY (approval_id) REFERENCES approvals_approvalrequest (id)
        ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
END $$;
"""

# Back to plain foreign keys (Django's own ON DELETE handling only).
BACKWARD = """
ALTER TABLE approvals_approvalrequest DROP CONSTRAINT approvals_request_run_cascade;
ALTER TABLE approvals_approvalrequest DROP CONSTRAINT approvals_request_step_cascade;
ALTER TABLE approvals_decisionattempt DROP CONSTRAINT approvals_attempt_approval_cascade;
ALTER TABLE approvals_approvalrequest ADD CONSTRAINT approvals_request_run_fk
    FOREIGN KEY (run_id) REFERENCES workflows_run (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE approvals_approvalrequest ADD CONSTRAINT approvals_request_step_fk
    FOREIGN KEY (step_row_id) REFERENCES workflows_step (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE approvals_decisionattempt ADD CONSTRAINT approvals_attempt_approval_fk
    FOREIGN KEY (approval_id) REFERENCES approvals_approvalrequest (id)
    DEFERRABLE INITIALLY DEFERRED;
"""


class Migration(migrations.Migration):
    dependencies = [("approvals", "0001_initial")]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)]
