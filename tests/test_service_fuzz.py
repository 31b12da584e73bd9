"""schemathesis against the API's own /openapi.json, bounded in examples: no request gets a 5xx. One test per
operation, each with its own id (schemathesis's own parametrization gives them all one, which pytest-xdist
collapses to a single test)."""
import tempfile

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from db import Database
from service.api import create_app

app = create_app(Database(f"sqlite:///{tempfile.mkdtemp()}/fuzz.db"), token="s3cret")
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
OPERATIONS = [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=[operation.label for operation in OPERATIONS])
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_request_gets_a_server_error(operation, data):
    case = data.draw(operation.as_strategy())
    if case.method == "POST":  # past the token check, so request bodies are what gets fuzzed
        case.headers = {**(case.headers or {}), "Authorization": "Bearer s3cret"}
    response = case.call()
    assert response.status_code < 500, f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
