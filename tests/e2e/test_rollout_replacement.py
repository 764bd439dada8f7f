"""Rollout by replacement under load (issue 13): test_rollout.py's load case with `reload =
"restart"`: 50 live addresses of the C++ and 50 of the Python example worker, a load of keep-alive
GET /<kind>/<n>/code on all of them, 20 rollouts alternating two versions, each stopping every
worker and starting a new one on the new set while its requests wait. No request may fail, and no
response may come from code older than the version whose rollout had completed before the request
was sent (test_rollout.check_versions).

A file of its own (one ctest entry, run beside the others): its 2,000 worker starts take ~100 s
under ASan on 2 busy cores, most of it the Python interpreter's start.
"""
import test_rollout
from test_rollout import rollouts_under_load

corral = test_rollout.corral  # the fixture, shared with test_rollout.py


def test_rollouts_under_load_by_replacement(corral):
    rollouts_under_load(corral, "restart")
