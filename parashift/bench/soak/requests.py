"""The soak's kinds of request, each drawn from a seeded random generator: completions and
chat, streamed or not, n > 1, structured output, a stream the client closes, a request the
client leaves while it waits, and bad input."""
import json
import random
from dataclasses import dataclass

PROMPTS = ("Once upon a time", "The capital of France is", "Write a haiku about rain.",
           "List three prime numbers.", "Explain what a hash table is.",
           "def fibonacci(n):", "The quick brown fox", "Summarize: the cat sat on the mat.")
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
# bad bodies for /v1/completions (each must be a 4xx with an error object)
BAD_COMPLETIONS = (
    {"prompt": "hi", "max_tokens": -5},
    {"prompt": "hi", "temperature": -1},
    {"prompt": "hi", "top_p": 7},
    {"prompt": [True, False], "max_tokens": 4},
    {"prompt": "hi", "seed": 18446744073709551616},
    {"prompt": "hi", "stream": "yes"},
    {"prompt": "hi", "n": 0},
    {"prompt": "hi", "logit_bias": {"99999999": 1}},
    {"prompt": "hi", "max_tokens": 4, "no_such_field": 1},
    {"max_tokens": 4},
    {"prompt": "hi", "model": "no-such-model"},
    {"prompt": "hi", "max_tokens": 10 ** 9},
)
BAD_CHATS = (
    {"messages": "hello"},
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {"messages": [{"role": "user", "content": "hi"}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
    {"messages": [{"role": "user", "content": "hi"}],
     "response_format": {"type": "json_schema",
                         "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
)
MALFORMED = (b"{\"prompt\": \"hi\", ", b"not json at all", b"[1, 2, 3]")


@dataclass
class Spec:
    kind: str
    path: str
    body: dict | None = None
    raw: bytes | None = None        # sent as is instead of `body`
    stream: bool = False
    n: int = 1
    bad_input: bool = False
    action: str = "read"            # read, close_stream (after a few events), leave (while waiting)
    leave_after_s: float = 0.0
    structured: bool = False


def _max_tokens(rng: random.Random) -> int:
    return rng.randint(4, 32)


def _messages(rng: random.Random) -> list[dict]:
    return [{"role": "user", "content": rng.choice(PROMPTS)}]


def completion(rng, stream=False):
    body = {"prompt": rng.choice(PROMPTS), "max_tokens": _max_tokens(rng), "stream": stream,
            "temperature": rng.choice((0.0, 0.8))}
    return Spec("completion_stream" if stream else "completion", "/v1/completions", body,
                stream=stream)


def chat(rng, stream=False):
    body = {"messages": _messages(rng), "max_tokens": _max_tokens(rng), "stream": stream}
    return Spec("chat_stream" if stream else "chat", "/v1/chat/completions", body, stream=stream)


def several_choices(rng):
    n, stream = rng.choice((2, 3)), rng.random() < 0.5
    if rng.random() < 0.5:
        spec = completion(rng, stream)
    else:
        spec = chat(rng, stream)
    spec.body.update(n=n, temperature=1.0, seed=rng.randint(0, 2 ** 31))
    spec.kind, spec.n = "n>1", n
    return spec


def structured(rng):
    body = {"messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "max_tokens": 48, "temperature": rng.choice((0.0, 1.0)),
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": PERSON}}}
    return Spec("structured", "/v1/chat/completions", body, structured=True)


def close_stream(rng):
    spec = rng.choice((completion, chat))(rng, stream=True)
    spec.body["max_tokens"] = 200
    spec.kind, spec.action = "close_stream", "close_stream"
    return spec


def leave_waiting(rng):
    spec = rng.choice((completion, chat))(rng, stream=False)
    spec.body["max_tokens"] = 200
    spec.kind, spec.action, spec.leave_after_s = "leave_waiting", "leave", rng.uniform(0.05, 1.5)
    return spec


def bad_input(rng):
    choice = rng.randrange(len(BAD_COMPLETIONS) + len(BAD_CHATS) + len(MALFORMED))
    if choice < len(BAD_COMPLETIONS):
        return Spec("bad_input", "/v1/completions", dict(BAD_COMPLETIONS[choice]), bad_input=True)
    choice -= len(BAD_COMPLETIONS)
    if choice < len(BAD_CHATS):
        return Spec("bad_input", "/v1/chat/completions", dict(BAD_CHATS[choice]),
                    bad_input=True)
    raw = MALFORMED[choice - len(BAD_CHATS)]
    return Spec("bad_input", "/v1/completions", raw=raw, bad_input=True)


MIX = {"completion": (2, lambda rng: completion(rng)),
       "completion_stream": (2, lambda rng: completion(rng, stream=True)),
       "chat": (2, lambda rng: chat(rng)),
       "chat_stream": (2, lambda rng: chat(rng, stream=True)),
       "n>1": (1, several_choices), "structured": (1, structured),
       "close_stream": (1, close_stream), "leave_waiting": (1, leave_waiting),
       "bad_input": (1, bad_input)}


def draw(rng: random.Random) -> Spec:
    """One request of the mix, by the weights of MIX."""
    names = list(MIX)
    name = rng.choices(names, weights=[MIX[k][0] for k in names])[0]
    return MIX[name][1](rng)


def check_person(text: str | None, finish_reason: str) -> str | None:
    """A structured answer that finished must be JSON of the schema's shape."""
    if finish_reason != "stop":
        return None
    try:
        value = json.loads(text or "")
    except ValueError:
        return f"structured output is not JSON: {text!r:.120}"
    if not (isinstance(value, dict) and set(value) == {"name", "age"}
            and isinstance(value["name"], str) and isinstance(value["age"], int)):
        return f"structured output off the schema: {text!r:.120}"
    return None
