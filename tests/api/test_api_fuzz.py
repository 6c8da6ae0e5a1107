"""Property-based fuzzing of every route of the OpenAPI document (schemathesis, in the test process).

Positive cases (valid per the schema) and negative ones (invalid per the schema) go over real
HTTP to a real API server and Redis; a stand-in that answers every enqueued request as a worker
would keeps valid requests short. Three properties must hold for every case:
    not_a_server_error       no 5xx, whatever the input;
    negative_data_rejection  input that breaks the schema is refused (4xx), never accepted;
    schema_valid_input_is_not_refused
                             input the schema admits is not answered 400, except for the limits the
                             document lists as beyond it (the served model's, by their error codes).
Bounded: a fixed number of examples per operation (well under a minute on 2 cores).
"""

from __future__ import annotations

import secrets

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection

from api.limits import MODEL_LIMIT_CODES
from api.main import create_app
from api.routes_batches import BATCH_LIMIT_CODES
from api.routes_files import FILE_LIMIT_CODES
from api.settings import ApiSettings
from batch.settings import BatchSettings
from tests.api.servers import API_KEY, ThreadApi
from tests.api.wire import MODEL, AutoResponder, publish_heartbeat, publish_model

EXAMPLES_PER_OPERATION = 40
STATUSES: dict[int, int] = {}  # status -> count, over the whole run
ANSWERED: list[list[str]] = []

schema = schemathesis.openapi.from_dict(create_app(ApiSettings()).openapi())
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=EXAMPLES_PER_OPERATION, deterministic=True
)


@schemathesis.check
def schema_valid_input_is_not_refused(ctx, response, case):
    """The published schema and the validation agree: a positive case answered 400 names a limit the
    document says it cannot state (api/limits.py MODEL_LIMIT_CODES), or the test fails."""
    if not case.meta.generation.mode.is_positive or response.status_code != 400:
        return None
    error = response.json().get("error", {})
    if error.get("code") in MODEL_LIMIT_CODES + FILE_LIMIT_CODES + BATCH_LIMIT_CODES:
        return None
    raise AssertionError(f"a request the published schema admits was refused: {error}")


@pytest.fixture(scope="module")
def fuzz_target(redis_server, tmp_path_factory):
    prefix = f"fz{secrets.token_hex(4)}"
    client = redis_server.client(decode_responses=True)
    publish_model(client, prefix, max_model_len=4096)
    publish_heartbeat(client, prefix, ttl_s=600)
    files = BatchSettings(redis_url=redis_server.url, prefix=prefix, files_dir=str(tmp_path_factory.mktemp("files")))
    server = ThreadApi(
        ApiSettings(redis_url=redis_server.url, prefix=prefix, api_keys=[API_KEY], request_timeout_s=10), files
    ).start()
    with AutoResponder(client, prefix) as responder:
        ANSWERED.append(responder.answered)
        yield server
    server.stop()
    client.close()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    derandomize=True,
)
def test_no_server_error_and_no_invalid_input_accepted(case, fuzz_target):
    if case.meta.generation.mode.is_positive and isinstance(case.body, dict) and "model" in case.body:
        # The schema cannot know the served name; without it every valid request would be a 404.
        case.body["model"] = MODEL
    response = case.call_and_validate(
        base_url=fuzz_target.url,
        headers={"Authorization": f"Bearer {API_KEY}"},
        checks=[not_a_server_error, negative_data_rejection, schema_valid_input_is_not_refused],
        timeout=15,
    )
    STATUSES[response.status_code] = STATUSES.get(response.status_code, 0) + 1


def test_the_fuzz_run_reached_the_queue():
    """Runs after the fuzz (file order): valid requests did get through to the request stream."""
    assert STATUSES.get(200, 0) > 20, STATUSES
    assert sum(len(ids) for ids in ANSWERED) > 10, STATUSES
    assert all(status < 500 for status in STATUSES), STATUSES
