"""The FastAPI app: routes, auth, error handlers and the engine's lifespan."""
import contextlib

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from parashift import version as package_version
from parashift.engine.async_engine import AsyncLLMEngine
from parashift.entrypoints.openai.auth import make_auth_dependency
from parashift.entrypoints.openai.errors import APIError, install_error_handlers
from parashift.entrypoints.openai.openapi import (add_json_post, error_responses,
                                                  publish_schemas)
from parashift.entrypoints.openai.protocol import (ChatCompletionRequest,
                                                   ChatCompletionResponse, CompletionRequest,
                                                   CompletionResponse, DetokenizeRequest,
                                                   DetokenizeResponse, LayoutRequest,
                                                   TokenizerInfoResponse,
                                                   LayoutResponse, ModelCard, ModelList,
                                                   TokenizeRequest, TokenizeResponse,
                                                   VersionResponse)
from parashift.entrypoints.openai.request_log import request_log
from parashift.entrypoints.openai.protocol_responses import ResponseObject, ResponsesRequest
from parashift.entrypoints.openai.readiness import Readiness, not_ready_reason, server_load
from parashift.entrypoints.openai.server_config import ServerConfig
from parashift.entrypoints.openai.serving_base import ServingContext
from parashift.entrypoints.openai.serving_chat import ChatServer
from parashift.entrypoints.openai.serving_completions import CompletionServer
from parashift.entrypoints.openai.serving_layout import LayoutServer
from parashift.entrypoints.openai.serving_responses import ResponsesServer
from parashift.entrypoints.openai.serving_tokens import TokenServer
from parashift.entrypoints.openai.shutdown import ShutdownDeadline
from parashift.metrics import ServerMetrics


def build_app(engine, config: ServerConfig) -> FastAPI:
    """An app serving `engine` (an LLMEngine). The engine thread starts with the
    app's lifespan and stops, after uvicorn has drained requests, at its end."""
    metrics = ServerMetrics(engine.model_name)
    async_engine = AsyncLLMEngine(engine, max_num_queued_requests=config.max_num_queued_requests,
                                  metrics=metrics)
    deadline = ShutdownDeadline(config.shutdown_timeout)
    ctx = ServingContext.from_engine(async_engine, config.served_model_names,
                                     config.max_request_bytes, deadline,
                                     tool_call_parser=config.tool_call_parser,
                                     enable_auto_tool_choice=config.enable_auto_tool_choice,
                                     response_role=config.response_role,
                                     scheduling_policy=config.scheduling_policy,
                                     request_log=request_log(config))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        async_engine.start()
        try:
            yield
        finally:
            await async_engine.shutdown()
            ctx.compile_threads.close()

    docs = not config.disable_fastapi_docs
    app = FastAPI(title="parashift", version=server_version(), lifespan=lifespan,
                  docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None)
    add_cors(app, config)
    app.state.async_engine = async_engine
    app.state.metrics = metrics
    app.state.serving = ctx
    app.state.shutdown_deadline = deadline  # started by the launcher's server
    install_error_handlers(app)
    app.state.readiness = Readiness()
    app.include_router(_health_routes(async_engine, metrics))
    app.include_router(_readiness_routes(async_engine, app.state.readiness))
    auth = [Depends(make_auth_dependency(config.api_key))]
    app.include_router(_v1_routes(ctx), dependencies=auth)
    app.include_router(_token_routes(ctx), dependencies=auth)
    app.include_router(_layout_routes(ctx, metrics), dependencies=auth)
    publish_schemas(app, [CompletionRequest, ChatCompletionRequest, ResponsesRequest,
                          TokenizeRequest, DetokenizeRequest, LayoutRequest])
    return app


def add_cors(app: FastAPI, config: ServerConfig) -> None:
    """CORS headers for the origins of --allowed-origins (none given: no CORS)."""
    if config.allowed_origins is None:
        return
    from fastapi.middleware.cors import CORSMiddleware
    app.add_middleware(CORSMiddleware, allow_origins=config.allowed_origins,
                       allow_methods=config.allowed_methods,
                       allow_headers=config.allowed_headers,
                       allow_credentials=config.allow_credentials)


def server_version() -> str:
    """What /version and /openapi.json give: parashift.__version__."""
    return package_version.__version__


def _health_routes(async_engine: AsyncLLMEngine, metrics: ServerMetrics) -> APIRouter:
    router = APIRouter()

    @router.get("/health", responses=error_responses(503))
    async def health() -> JSONResponse:
        if async_engine.is_running:
            faults = async_engine.faults
            load = server_load(async_engine)
            if faults is None or not faults.groups_down:  # (after a recovery: the report)
                report = faults.as_json() if faults is not None and faults.worker_restarts else {}
                return JSONResponse({"status": "ok", "load": load, **report})
            return JSONResponse({"status": "degraded", "load": load, **faults.as_json()})
        message = str(async_engine.dead_error or "the engine is not running")
        return APIError(503, message, code="engine_dead").response()

    for method in ("GET", "POST"):  # vLLM's /ping: /health by another name
        router.add_api_route("/ping", health, methods=[method])

    @router.get("/version", response_model=VersionResponse)
    async def version() -> JSONResponse:
        return JSONResponse({"version": server_version()})

    @router.get("/metrics", response_class=PlainTextResponse,
                responses={200: {"description": "Prometheus' text format"}})
    async def prometheus_metrics() -> Response:
        metrics.record_liveness(async_engine.is_running)
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return router


def _readiness_routes(async_engine: AsyncLLMEngine, readiness: Readiness) -> APIRouter:
    """`/ready` for readiness probes and balancers (readiness.py)."""
    router = APIRouter()

    @router.get("/ready", responses=error_responses(503))
    async def ready() -> JSONResponse:
        reason = not_ready_reason(async_engine, readiness)
        if reason is None:
            return JSONResponse({"status": "ready", "load": server_load(async_engine)})
        code, message = reason
        return APIError(503, message, code=code).response()

    return router


def _v1_routes(ctx: ServingContext) -> APIRouter:
    router = APIRouter(prefix="/v1")
    completions, chat = CompletionServer(ctx), ChatServer(ctx)

    @router.get("/models", response_model=ModelList, responses=error_responses(401))
    async def list_models() -> JSONResponse:
        cards = [ModelCard(id=name, max_model_len=ctx.max_model_len)
                 for name in ctx.model_names]
        return JSONResponse(ModelList(data=cards).model_dump())

    add_json_post(router, "/completions", completions.create, CompletionRequest,
                  CompletionResponse, "create_completion")
    add_json_post(router, "/chat/completions", chat.create, ChatCompletionRequest,
                  ChatCompletionResponse, "create_chat_completion")
    add_json_post(router, "/responses", ResponsesServer(ctx).create, ResponsesRequest,
                  ResponseObject, "create_response")
    return router


def _token_routes(ctx: ServingContext) -> APIRouter:
    """vLLM's /tokenize, /detokenize and /tokenizer_info (at the root, as vLLM serves
    them; lm-evaluation-harness tokenizes through them)."""
    router = APIRouter()
    tokens = TokenServer(ctx)

    add_json_post(router, "/tokenize", tokens.tokenize, TokenizeRequest, TokenizeResponse,
                  "tokenize")
    add_json_post(router, "/detokenize", tokens.detokenize, DetokenizeRequest,
                  DetokenizeResponse, "detokenize")
    router.add_api_route("/tokenizer_info", tokens.tokenizer_info, methods=["GET"],
                         response_model=TokenizerInfoResponse, name="tokenizer_info")
    return router


def _layout_routes(ctx: ServingContext, metrics: ServerMetrics) -> APIRouter:
    """The node's parallel layout, and an administrator's width (serving_layout.py)."""
    router = APIRouter(prefix="/v1/parallel")
    layout = LayoutServer(ctx, metrics)
    router.add_api_route("/layout", layout.show, methods=["GET"], response_model=LayoutResponse,
                         name="show_layout", responses=error_responses(401))
    add_json_post(router, "/layout", layout.force, LayoutRequest, LayoutResponse, "set_layout")
    return router
