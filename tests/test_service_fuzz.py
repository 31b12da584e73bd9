"""schemathesis against the API's own /openapi.json, bounded in examples: no request gets a 5xx."""
import tempfile

import schemathesis
from hypothesis import HealthCheck, settings

from db import Database
from service.api import create_app

app = create_app(Database(f"sqlite:///{tempfile.mkdtemp()}/fuzz.db"), token="s3cret")
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):
    if case.method == "POST":  # past the token check, so request bodies are what gets fuzzed
        case.headers = {**(case.headers or {}), "Authorization": "Bearer s3cret"}
    response = case.call()
    assert response.status_code < 500, f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
