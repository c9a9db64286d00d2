"""GET and POST /v1/parallel/layout: the node layout, and an administrator's width
(`{"width": w}` merges every aligned group of w replicas, `{"width": null}` hands the
layout back to the parallel policy); see `LLMEngine.set_layout`."""
from fastapi import Request
from fastapi.responses import JSONResponse

from parashift.engine.async_engine import EngineDeadError
from parashift.entrypoints.openai.errors import bad_request
from parashift.entrypoints.openai.protocol import LayoutRequest, LayoutResponse
from parashift.entrypoints.openai.serving_base import Handler, api_error, parse_body


class LayoutServer(Handler):
    def __init__(self, ctx, metrics=None):
        super().__init__(ctx)
        self.metrics = metrics

    async def show(self) -> JSONResponse:
        info = await self._call(lambda engine: engine.layout_info())
        return JSONResponse(LayoutResponse(**info).model_dump())

    async def force(self, raw: Request) -> JSONResponse:
        request = await parse_body(raw, LayoutRequest, self.ctx.max_request_bytes)
        try:
            info = await self._call(lambda engine: _set(engine, request.width))
        except ValueError as exc:
            raise bad_request(str(exc), param="width", code="invalid_width") from None
        if self.metrics is not None:
            self.metrics.record_layout(info)
        return JSONResponse(LayoutResponse(**info).model_dump())

    async def _call(self, function):
        try:
            return await self.ctx.engine.call(function)
        except EngineDeadError as exc:
            raise api_error(exc) from None


def _set(engine, width: int | None) -> dict:
    engine.set_layout(width)
    return engine.layout_info()
