import openai
import pytest

from tests.entrypoints.openai.server_utils import running_server, shared_engine


@pytest.fixture(scope="session")
def engine():
    return shared_engine()


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model_name(engine):
    return engine.model_name
