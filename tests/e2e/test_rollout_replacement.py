"""Rollout by replacement under load (issue 13): test_rollout.py's load case with `reload =
"restart"`: 20 live addresses of the C++ and 20 of the Python example worker, a load of keep-alive
GET /<kind>/<n>/code on all of them, 6 rollouts alternating two versions (each direction three
times), each stopping every worker and starting a new one on the new set while its requests wait.
No request may fail, and no response may come from code older than the version whose rollout had
completed before the request was sent (test_rollout.check_versions).

A file of its own (one ctest entry, run beside the others). Its 280 worker starts take ~40 s
under ASan on 2 cores; the 2,000 of 20 rollouts on 50 addresses each (what the in-place case
runs) took 390-500 s there, most of it the Python interpreter's start, and proved nothing more:
every rollout replaces every worker the same way.
"""
import test_rollout
from test_rollout import rollouts_under_load

corral = test_rollout.corral  # the fixture, shared with test_rollout.py


def test_rollouts_under_load_by_replacement(corral):
    rollouts_under_load(corral, "restart", rounds=6, per_kind=20)
