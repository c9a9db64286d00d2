"""The request bodies in /openapi.json.

The handlers read their bodies themselves (to refuse an oversized one while it
arrives, and to give OpenAI-shaped errors), so FastAPI cannot see the models:
each route declares its body with `json_body(Model)`, and `publish_schemas` adds
the models' JSON schemas to the document's components."""
from fastapi import APIRouter, FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from parashift.entrypoints.openai.protocol import ErrorResponse

REF_TEMPLATE = "#/components/schemas/{model}"

# The errors an API route may answer, each with OpenAI's error object (errors.py)
ERRORS = {400: "invalid request: the error names the field (`param`)",
          401: "missing or invalid API key (with --api-key)",
          404: "no such model",
          413: "the body is larger than --max-request-bytes",
          500: "the engine failed, or the request could not be completed",
          503: "overloaded (Retry-After), shutting down, or the engine is dead"}


def error_responses(*statuses: int) -> dict:
    """FastAPI's `responses` for these statuses (default: all of ERRORS)."""
    return {status: {"model": ErrorResponse, "description": ERRORS[status]}
            for status in statuses or ERRORS}


def json_body(model: type[BaseModel]) -> dict:
    """A route's `openapi_extra`: its body is `model` as JSON."""
    schema = {"$ref": REF_TEMPLATE.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": schema}}}}


def add_json_post(router: APIRouter, path: str, handle, body: type[BaseModel],
                  response: type[BaseModel], name: str) -> None:
    """POST `path`, answered by `handle(request)`, which reads a `body` itself and
    answers a `response` or an error (all documented)."""
    router.add_api_route(path, handle, methods=["POST"], name=name,
                         openapi_extra=json_body(body), response_model=response,
                         responses=error_responses())


def publish_schemas(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Puts the schemas of `models`, and of the models they use, in the app's OpenAPI
    components (so the `$ref`s of `json_body` resolve)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = build()
            _, defs = models_json_schema([(model, "validation") for model in models],
                                         ref_template=REF_TEMPLATE)
            components = document.setdefault("components", {}).setdefault("schemas", {})
            components.update(defs.get("$defs", {}))
        return app.openapi_schema

    app.openapi = openapi
