"""GET and POST /v1/parallel/layout on a single-rank CPU server: it reports its one
layout, takes width 1, refuses widths it cannot take with a 400 naming the field, and
needs the API key; /metrics shows the layout."""
import httpx
import pytest

from tests.entrypoints.openai.server_utils import MAX_MODEL_LEN, metric_value, running_server

KEY = "layout-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine, api_key=KEY) as srv:
        yield srv


def url(server) -> str:
    return f"{server.base_url}/v1/parallel/layout"


def test_get_reports_groups_widths_and_max_context(server):
    response = httpx.get(url(server), headers=AUTH)
    assert response.status_code == 200
    assert response.json() == {
        "groups": [{"ranks": [0], "plan": "single", "width": 1}], "forced_width": None,
        "widths": [{"width": 1, "plans": ["single"], "max_context": MAX_MODEL_LEN}]}


def test_forcing_a_width_it_can_take_and_handing_back(server, client, model_name):
    response = httpx.post(url(server), headers=AUTH, json={"width": 1})
    assert response.status_code == 200 and response.json()["forced_width"] == 1
    assert metric_value(server.base_url, "parashift_layout_info", plans="single",
                        forced_width="1") == 1
    forced = httpx.post(f"{server.base_url}/v1/completions", headers=AUTH,
                        json={"model": model_name, "prompt": "Hi", "max_tokens": 2})
    assert forced.status_code == 200  # it serves while forced
    back = httpx.post(url(server), headers=AUTH, json={"width": None})
    assert back.status_code == 200 and back.json()["forced_width"] is None
    assert metric_value(server.base_url, "parashift_layout_width", group="0") == 1
    assert metric_value(server.base_url, "parashift_layout_info", plans="single",
                        forced_width="none") == 1
    assert metric_value(server.base_url, "parashift_layout_info", forced_width="1") == 0


@pytest.mark.parametrize("body, message", [
    ({"width": 2}, "width 2 is not one this node can take; widths: [1]"),
    ({"width": 0}, "greater than or equal to 1"),
    ({"width": "2"}, "integer"),
    ({}, "width"),
    ({"width": 1, "extra": True}, "extra"),
])
def test_bad_widths_are_400_naming_the_field(server, body, message):
    response = httpx.post(url(server), headers=AUTH, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"]
    assert error["param"] in ("width", "extra")
    assert httpx.get(url(server), headers=AUTH).json()["forced_width"] is None


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_routes_need_the_api_key(server, method):
    response = httpx.request(method, url(server), json={"width": 1})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
