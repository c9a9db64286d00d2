"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

Messages are written for the client: never a stack trace or a file path. The
full exception of an unexpected failure goes to the server log only."""
import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from parashift.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)

TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error the client is told about, with its HTTP status."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, err_type: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.err_type = err_type or TYPE_BY_STATUS.get(status, "api_error")
        self.headers = headers

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=self.err_type, param=self.param,
                         code=self.code)
        return ErrorResponse(error=info).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_validation_error(exc: ValidationError | RequestValidationError) -> APIError:
    """One 400 naming the offending field."""
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first.get('msg', '')}",
                           code="invalid_json")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "extra_forbidden":
        message = "unknown field"
    fields = {str((e.get("loc") or ("",))[0]) for e in errors}
    if len(errors) > 1 and len(fields) == 1 and loc:
        loc = loc[:1]  # one field failed every form of a union: name the field only
        message = f"matches none of the accepted forms ({message})"
    param = ".".join(loc) or _leading_field(message)
    text = f"{'.'.join(loc)}: {message}" if loc else message
    return bad_request(text, param=param)


def _leading_field(message: str) -> str | None:
    """`n must be 1` -> `n`: model-level checks start with the field they check."""
    word = message.split(" ", 1)[0]
    return word if word.isidentifier() and word.islower() else None


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_request_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unexpected)


async def _on_api_error(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _on_request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    return from_validation_error(exc).response()


async def _on_http_exception(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "error"
    message = exc.detail if isinstance(exc.detail, str) else phrase
    return APIError(exc.status_code, message, headers=getattr(exc, "headers", None)).response()


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error while serving a request", exc_info=exc)
    return APIError(500, f"internal server error ({type(exc).__name__})").response()
