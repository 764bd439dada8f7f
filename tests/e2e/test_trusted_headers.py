"""Trusted headers by another spelling (issue 11 #10): corral sets Corral-* headers for workers and
routes (Corral-Principal, Corral-Remote-Address, ...) and trusts Forwarded / X-Forwarded-* /
X-Real-IP only from relays. CGI and WSGI servers map '-' and '_' alike to '_'
(HTTP_CORRAL_PRINCIPAL), so `Corral_Principal: admin` from a client would read as the trusted
header. Admission drops every header whose name, with '_' read as '-', case-insensitively names a
trusted one; other names with '_' pass. Checked through a worker route to the Python example
worker, whose /headers echoes the header lines it received.
"""
import json

import test_workers

corral = test_workers.corral  # the fixture, shared with test_workers.py

SPOOFED = {
    "Corral_Principal": "admin",
    "corral_principal": "admin-lower",
    "CORRAL_REMOTE_ADDRESS": "10.6.6.6",
    "Corral-Principal": "admin-dash",
    "X_Forwarded_For": "6.6.6.6",
    "x_forwarded_proto": "https",
    "X_Real_IP": "7.7.7.7",
    "Forwarded_": "not-a-trusted-name",  # with '_' as '-' it is "forwarded-": kept
}


def test_trusted_header_spelt_with_underscores_never_reaches_worker(corral):
    c = corral("py", extra='log_level = "debug"')
    status, _, body = c.get("/counter/h/headers",
                            headers={**SPOOFED, "X-Ordinary": "yes", "My_Header": "kept"})
    assert status == 200, body
    seen = json.loads(body)
    names = {k.lower().replace("_", "-"): v for k, v in seen}
    values = [v for _, v in seen]
    for spoofed in ("admin", "admin-lower", "admin-dash", "10.6.6.6", "6.6.6.6", "7.7.7.7"):
        assert spoofed not in values, (spoofed, seen)
    assert "corral-principal" not in names, seen  # an anonymous request: no principal at all
    assert "x-forwarded-for" not in names and "x-real-ip" not in names, seen
    assert names.get("x-forwarded-proto") is None, seen
    # Ordinary headers, with or without '_', still cross; corral's own Corral-* are there.
    assert ["X-Ordinary", "yes"] in seen, seen
    assert ["My_Header", "kept"] in seen, seen
    assert ["Forwarded_", "not-a-trusted-name"] in seen, seen
    assert names.get("corral-remote-address") == "127.0.0.1", seen
    c.srv.wait_log(r"headers_dropped remote=127\.0\.0\.1 count=6 ")
