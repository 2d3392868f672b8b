"""Settings for the test suite: the production settings plus the tests' `probe` step type.

The probe lives with the tests (tests/probe_steps.py), never in the engine. Worker and relay
processes started by the tests name it in WAYMARK_EXTRA_STEP_MODULES (tests/processes.py).
"""

from .settings import *  # noqa: F403
from .settings import WAYMARK

PROBE_STEPS = "tests.probe_steps"
_extra = [m for m in WAYMARK["EXTRA_STEP_MODULES"] if m != PROBE_STEPS]
WAYMARK = {**WAYMARK, "EXTRA_STEP_MODULES": [*_extra, PROBE_STEPS]}

# A walk's time budget is tested on its own (tests/test_bounded_work.py); elsewhere a loaded
# machine must not turn an inline walk into a continuation in the middle of a test.
WAYMARK["WALK_INLINE_MS"] = 60_000.0
WAYMARK["CODE_TURN_MS"] = 60_000.0  # a loaded test machine; the budget's tests set their own

# Rate limits and quotas are tested on their own (tests/test_limits.py), with small values;
# elsewhere hundreds of requests and failed keys from 127.0.0.1 must not trip them.
REST_FRAMEWORK = {
    **REST_FRAMEWORK,  # noqa: F405
    "DEFAULT_THROTTLE_RATES": {"api_key": None, "run_starts": None, "auth_failures": None},
}

# The stub servers listen on 127.0.0.1, which organisations allowlist in the effect tests;
# the ceiling itself is tested with its own values (tests/test_egress_allowlist.py).
EFFECTS = {**EFFECTS, "EGRESS_ALLOWABLE": ["127.0.0.1/32"]}  # noqa: F405
