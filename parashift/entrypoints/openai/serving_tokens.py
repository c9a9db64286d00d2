"""POST /tokenize and /detokenize, in vLLM's shapes: the token ids the server would
give the engine for a prompt or a chat, and the text of token ids; GET /tokenizer_info."""
from fastapi import Request
from fastapi.responses import JSONResponse

from parashift.entrypoints.openai.protocol import (DetokenizeRequest, DetokenizeResponse,
                                                   TokenizeRequest, TokenizeResponse,
                                                   TokenizerInfoResponse)
from parashift.entrypoints.openai.serving_base import Handler, parse_body
from parashift.entrypoints.openai.serving_chat import ChatServer
from parashift.entrypoints.openai.tool_fields import template_tools


class TokenServer(Handler):
    async def tokenize(self, raw: Request) -> JSONResponse:
        ctx = self.ctx
        request = await parse_body(raw, TokenizeRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        tokens = self.token_ids(request)
        strs = ctx.tokenizer.convert_ids_to_tokens(tokens) if request.return_token_strs else None
        response = TokenizeResponse(count=len(tokens), max_model_len=ctx.max_model_len,
                                    tokens=tokens, token_strs=strs)
        return JSONResponse(response.model_dump())

    def token_ids(self, request: TokenizeRequest) -> list[int]:
        """What /v1/completions (prompt) or /v1/chat/completions (messages) would run."""
        if request.messages is None:
            return self.ctx.encode(request.prompt, request.add_special_tokens)
        return self.ctx.render_chat(ChatServer.conversation(request),
                                    request.add_generation_prompt, template_tools(request.tools))

    async def detokenize(self, raw: Request) -> JSONResponse:
        ctx = self.ctx
        request = await parse_body(raw, DetokenizeRequest, ctx.max_request_bytes)
        ctx.check_model(request.model)
        ctx.check_vocabulary(request.tokens, "tokens")
        return JSONResponse(DetokenizeResponse(prompt=ctx.decode(request.tokens)).model_dump())

    async def tokenizer_info(self) -> JSONResponse:
        ctx = self.ctx
        ctx.require_tokenizer("tokenizer")
        tokenizer = ctx.tokenizer
        info = TokenizerInfoResponse(
            tokenizer_class=type(tokenizer).__name__,
            **{name: getattr(tokenizer, name, None)
               for name in ("eos_token", "bos_token", "pad_token", "unk_token")},
            chat_template=getattr(tokenizer, "chat_template", None),
            model_max_length=ctx.max_model_len)
        return JSONResponse(info.model_dump())
