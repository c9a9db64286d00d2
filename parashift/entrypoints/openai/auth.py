"""Bearer-token check for the /v1 routes (`--api-key` or PARASHIFT_API_KEY)."""
import hmac
import os

from fastapi import Request

from parashift.entrypoints.openai.errors import APIError

API_KEY_ENV = "PARASHIFT_API_KEY"


def resolve_api_key(cli_value: str | None) -> str | None:
    """The key the server requires: the flag if given, else the environment."""
    key = cli_value if cli_value is not None else os.environ.get(API_KEY_ENV)
    return key or None


def make_auth_dependency(api_key: str | None):
    """A FastAPI dependency that raises 401 unless `Authorization: Bearer <key>`."""
    expected = None if api_key is None else api_key.encode()

    async def require_api_key(request: Request) -> None:
        if expected is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 expected):
            raise APIError(401, "missing or invalid API key; send "
                           "'Authorization: Bearer <key>'", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    return require_api_key
