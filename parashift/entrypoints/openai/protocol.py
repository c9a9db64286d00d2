"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Requests forbid unknown fields: a misspelt option is an error, not a silent
default. Fields OpenAI defines but parashift does not implement are accepted
only at their neutral value (e.g. an empty `suffix`)."""
import time
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator,
                      model_validator)

from parashift.entrypoints.openai.structured_fields import StructuredFields
from parashift.entrypoints.openai.tool_fields import (ChatTool, DeltaToolCall, ToolCall,
                                                     ToolFields)
from parashift.sampling_params import SEED_MAX, SEED_MIN

# /v1/completions without max_tokens (absent or null) generates this many, as OpenAI's
# does; /v1/chat/completions without it generates up to the context's end, as vLLM's.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# The most samples (n, best_of) one request may ask for: each is a sequence in the engine.
MAX_SAMPLES_PER_REQUEST = 128


def _finite_float():
    """An optional float that refuses NaN and infinities (JSON's NaN/Infinity extensions)."""
    return Field(default=None, allow_inf_nan=False)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(StrictModel):
    include_usage: bool = False


class SamplingFields(StructuredFields):
    """Options shared by /v1/completions and /v1/chat/completions."""
    model: str | None = None
    temperature: float | None = _finite_float()
    top_p: float | None = _finite_float()
    top_k: int | None = None
    min_p: float | None = _finite_float()
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_SAMPLES_PER_REQUEST)
    user: str | None = None
    presence_penalty: float | None = _finite_float()
    frequency_penalty: float | None = _finite_float()
    repetition_penalty: float | None = _finite_float()
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias
    # vLLM's extra field: the prompt tokens' logprobs with this many alternatives
    prompt_logprobs: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check_unsupported(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    # one prompt (text or token ids), or a batch of them (completion_prompts.py)
    prompt: str | list[StrictInt] | list[str | list[StrictInt]]
    max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    logprobs: int | None = Field(default=None, ge=0)  # at most --max-logprobs
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_SAMPLES_PER_REQUEST)
    suffix: str | None = None

    @field_validator("max_tokens")
    @classmethod
    def _null_is_default(cls, value: int | None) -> int:
        return COMPLETIONS_DEFAULT_MAX_TOKENS if value is None else value

    @model_validator(mode="after")
    def _check_completion_fields(self):
        if self.stream and self.best_of is not None and self.best_of > (self.n or 1):
            raise ValueError("best_of greater than n cannot be streamed: the best samples "
                             "are known only once all have finished")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None           # a tool turn's answer to that call

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(ToolFields, SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)  # at most --max-logprobs

    @model_validator(mode="after")
    def _check_chat_fields(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class TokenizeRequest(StrictModel):
    """POST /tokenize, vLLM's two forms in one: `prompt` (a completion's text) or
    `messages` (a chat, rendered by the chat template as /v1/chat/completions does)."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    return_token_strs: bool = False
    tools: list[ChatTool] | None = None  # with messages: rendered as chat requests do

    @model_validator(mode="after")
    def _one_form(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt or messages: give exactly one of the two")
        fields = self.model_fields_set
        if self.prompt is not None and "add_generation_prompt" in fields:
            raise ValueError("add_generation_prompt goes with messages, not prompt")
        if self.prompt is not None and self.tools is not None:
            raise ValueError("tools go with messages, not prompt")
        if self.messages is not None and "add_special_tokens" in fields:
            raise ValueError("add_special_tokens goes with prompt; the chat template "
                             "places the special tokens of messages")
        return self


class DetokenizeRequest(StrictModel):
    model: str | None = None
    tokens: list[StrictInt]


# ---- responses ---------------------------------------------------------------
class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "UsageInfo":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """A prompt token's logprob in vLLM's response shape."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# per prompt token: null for the first, then {token id: its logprob} (vLLM's shape)
PromptLogprobsField = list[dict[str, PromptLogprob] | None] | None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobsField = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: str = "assistant"  # --response-role
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobsField = None


class DeltaMessage(BaseModel):
    role: str | None = None  # the first chunk's: --response-role
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "parashift"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfoResponse(BaseModel):
    """GET /tokenizer_info: the tokenizer's special tokens and chat template (vLLM's)."""
    tokenizer_class: str
    eos_token: str | None = None
    bos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    chat_template: str | None = None
    model_max_length: int


class VersionResponse(BaseModel):
    version: str


class LayoutRequest(StrictModel):
    """POST /v1/parallel/layout: a width to force, or null to hand the layout back."""
    width: StrictInt | None = Field(ge=1)


class LayoutGroup(BaseModel):
    ranks: list[int]
    plan: str
    width: int


class LayoutWidth(BaseModel):
    width: int
    plans: list[str]
    max_context: int  # the longest context one group of this width holds, in tokens


class LayoutResponse(BaseModel):
    groups: list[LayoutGroup]
    forced_width: int | None
    widths: list[LayoutWidth]
