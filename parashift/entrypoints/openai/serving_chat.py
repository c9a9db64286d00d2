"""POST /v1/chat/completions: messages in, the assistant's reply out (JSON or SSE), with
its tool calls when the request gives tools."""
import json
import uuid

from fastapi import Request
from fastapi.responses import Response

from parashift.engine.async_engine import RequestStream
from parashift.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs_field
from parashift.entrypoints.openai.protocol import (AssistantMessage, ChatChoice,
                                                   ChatCompletionChunk, ChatCompletionRequest,
                                                   ChatCompletionResponse, ChatStreamChoice,
                                                   DeltaMessage, UsageInfo)
from parashift.entrypoints.openai.errors import bad_request
from parashift.entrypoints.openai.serving_base import (Handler,
                                                       build_sampling_params, final_output,
                                                       parse_body, respond, stream_events)
from parashift.entrypoints.openai.tool_fields import DeltaToolCall, FunctionCall, ToolCall
from parashift.entrypoints.openai.tool_parsers import TOOL_PARSERS
from parashift.structured import StructuredOutputsParams

ROLE_FOR_TEMPLATE = {"developer": "system"}


class ChatServer(Handler):
    async def create(self, raw: Request) -> Response:
        ctx = self.ctx
        request = await parse_body(raw, ChatCompletionRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        self.check_tool_choice(request)
        prompt_ids = ctx.render_chat(self.conversation(request), tools=request.template_tools())
        ctx.check_prompt_ids(prompt_ids)
        requested = ctx.default_max_tokens(request.requested_max_tokens, None)
        params = build_sampling_params(request, requested, self.num_logprobs(request),
                                       ctx.sampling_defaults,
                                       logit_bias=ctx.logit_bias(request.logit_bias),
                                       prompt_logprobs=request.prompt_logprobs)
        await ctx.check_structured(params, self.force_tool_call(request, params))
        params.max_tokens = ctx.fit_max_tokens(len(prompt_ids), requested)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        return await respond(ctx, raw, self, request, request_id, prompt_ids, params)

    def check_tool_choice(self, request: ChatCompletionRequest) -> None:
        if request.tool_mode == "auto" and not (self.ctx.enable_auto_tool_choice
                                                and self.ctx.tool_call_parser):
            raise bad_request('tool_choice "auto" needs the server started with '
                              "--enable-auto-tool-choice and --tool-call-parser",
                              param="tool_choice")

    @staticmethod
    def force_tool_call(request: ChatCompletionRequest, params) -> str | None:
        """With tool_choice "required" or a named function, constrains the output to the
        call's JSON (as vLLM). Returns the field that constrains the output."""
        schema = request.forced_call_schema()
        if schema is None:
            return request.structured_param
        if request.structured_param is not None:
            raise bad_request(f"tool_choice {request.tool_mode!r} cannot be combined with "
                              f"{request.structured_param}", param="tool_choice")
        params.structured_outputs = StructuredOutputsParams(json=schema)
        return "tools"

    @staticmethod
    def conversation(request) -> list[dict]:
        """The chat template's turns of `request.messages` (a chat or tokenize request)."""
        turns = []
        for message in request.messages:
            turn = {"role": ROLE_FOR_TEMPLATE.get(message.role, message.role),
                    "content": message.text()}
            for name in ("name", "tool_call_id"):
                if getattr(message, name):
                    turn[name] = getattr(message, name)
            if message.tool_calls:
                turn["tool_calls"] = [_template_call(call) for call in message.tool_calls]
            turns.append(turn)
        return turns

    def reply(self, request: ChatCompletionRequest, text: str,
              finish: str | None) -> tuple[str | None, list[ToolCall], str | None]:
        """The reply's content, tool calls and finish reason ("tool_calls" when the model
        chose to call; a named call keeps "stop", as vLLM)."""
        mode = request.tool_mode
        if mode == "named":
            return None, [ToolCall(function=FunctionCall(name=request.named_function,
                                                         arguments=text))], finish
        if mode == "required":
            calls = _required_calls(text)
        elif mode == "auto":
            parsed = TOOL_PARSERS[self.ctx.tool_call_parser]().parse(text)
            text = parsed.content if parsed.calls else text
            calls = [ToolCall(function=FunctionCall(name=c.name, arguments=c.arguments))
                     for c in parsed.calls]
        else:
            calls = []
        if not calls:
            return text, [], finish
        return (text if mode == "auto" else None), calls, "tool_calls" if finish == "stop" \
            else finish

    def shown(self, request: ChatCompletionRequest, completion, finished: bool) -> str:
        """The text a stream shows: a tool call's is held back until the reply is parsed
        (then the calls come in one delta)."""
        text = completion.text
        if request.tool_mode == "auto":
            parser = TOOL_PARSERS[self.ctx.tool_call_parser]()
            streamable = text[:parser.streamable(text)]
        else:
            streamable = ""
        if finished and not self.reply(request, text, completion.finish_reason)[1]:
            return text
        return streamable

    @staticmethod
    def num_logprobs(request: ChatCompletionRequest) -> int | None:
        if not request.logprobs:
            return None
        return request.top_logprobs or 0

    def logprobs(self, request: ChatCompletionRequest, completion, first: int):
        if not request.logprobs or completion.logprobs is None:
            return None
        return chat_logprobs(self.ctx.decode_token, completion.token_ids[first:],
                             completion.logprobs[first:], request.top_logprobs or 0)

    async def collect(self, stream: RequestStream, request: ChatCompletionRequest):
        final = await final_output(self.ctx, stream)
        outputs = final.outputs
        choices, role = [], self.ctx.response_role
        for c in outputs:
            content, calls, finish = self.reply(request, c.text, c.finish_reason)
            message = AssistantMessage(role=role, content=content, tool_calls=calls)
            choices.append(ChatChoice(index=c.index, message=message, finish_reason=finish,
                                      logprobs=self.logprobs(request, c, 0)))
        usage = UsageInfo.of(stream.num_prompt_tokens, sum(len(c.token_ids) for c in outputs))
        return ChatCompletionResponse(id=stream.request_id, model=self.ctx.model_name,
                                      choices=choices, usage=usage,
                                      prompt_logprobs=prompt_logprobs_field(
                                          final.prompt_logprobs))

    def stream(self, stream: RequestStream, request: ChatCompletionRequest):
        def choice(delta, finish, completion, sent_tokens, sent_chars):
            calls = None
            if finish is not None and request.tool_mode != "none":
                _, found, finish = self.reply(request, completion.text, finish)
                calls = [DeltaToolCall(index=i, **c.model_dump()) for i, c in enumerate(found)]
            return ChatStreamChoice(index=completion.index,
                                    delta=DeltaMessage(content=delta, tool_calls=calls or None),
                                    finish_reason=finish,
                                    logprobs=self.logprobs(request, completion, sent_tokens))

        def chunk(created, choices, usage=None):
            return self.chunk(stream, created, choices, usage)
        first = DeltaMessage(role=self.ctx.response_role, content="")
        opening = tuple(ChatStreamChoice(index=i, delta=first) for i in range(request.n or 1))
        shown = None if request.tool_mode == "none" else (
            lambda completion, finished: self.shown(request, completion, finished))
        return stream_events(self.ctx, stream, request.include_usage, choice, chunk, opening,
                             shown)

    def chunk(self, stream: RequestStream, created: int, choices, usage=None):
        return ChatCompletionChunk(id=stream.request_id, created=created,
                                   model=self.ctx.model_name, choices=choices, usage=usage)


def _template_call(call: ToolCall) -> dict:
    """A past call as chat templates take it: arguments as an object where they parse."""
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        arguments = call.function.arguments
    return {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": arguments}}


def _required_calls(text: str) -> list[ToolCall]:
    """The calls of a reply forced into [{"name": ..., "parameters": {...}}, ...]; none if
    it was cut short."""
    try:
        return [ToolCall(function=FunctionCall(name=c["name"], arguments=json.dumps(
            c["parameters"], ensure_ascii=False))) for c in json.loads(text)]
    except (ValueError, KeyError, TypeError):
        return []
