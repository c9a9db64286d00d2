"""The soak's judgement of one answer: what counts as answered, what as a server failure."""
import json

from parashift.bench.soak.outcomes import StreamReader, judge_body, judge_failure
from parashift.bench.soak.requests import check_person

ERROR = json.dumps({"error": {"message": "bad", "type": "invalid_request_error",
                              "param": "x", "code": None}})


def test_an_error_needs_openais_error_object():
    assert judge_failure(400, ERROR, bad_input=True)[0] == "refused"
    assert judge_failure(500, ERROR, bad_input=False)[0] == "error"
    assert judge_failure(503, ERROR, bad_input=False)[0] == "error"
    assert judge_failure(500, "Internal Server Error", bad_input=False)[0] == "unclear"
    assert judge_failure(400, '{"detail": "bad"}', bad_input=True)[0] == "unclear"


def test_bad_input_must_be_a_4xx_and_valid_input_must_not_be():
    assert judge_failure(500, ERROR, bad_input=True)[0] == "unclear"
    assert judge_failure(400, ERROR, bad_input=False)[0] == "refused_valid"
    assert judge_failure(429, ERROR, bad_input=False)[0] == "error"


def test_a_body_needs_every_choice_finished():
    finished = {"choices": [{"index": 0, "text": "a", "finish_reason": "length"},
                            {"index": 1, "text": "b", "finish_reason": "stop"}]}
    assert judge_body(finished, 2)[0] == "completed"
    assert judge_body(finished, 3)[0] == "invalid"
    unfinished = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
    assert judge_body(unfinished, 1)[0] == "invalid"


def test_structured_answers_are_checked_when_they_stopped():
    ok = {"choices": [{"index": 0, "message": {"content": '{"name": "Al", "age": 3}'},
                       "finish_reason": "stop"}]}
    off = {"choices": [{"index": 0, "message": {"content": '{"name": "Al"}'},
                        "finish_reason": "stop"}]}
    cut = {"choices": [{"index": 0, "message": {"content": '{"name": "A'},
                        "finish_reason": "length"}]}
    assert judge_body(ok, 1, check_person)[0] == "completed"
    assert judge_body(off, 1, check_person)[0] == "invalid"
    assert judge_body(cut, 1, check_person)[0] == "completed"


def read(lines: list[str]) -> StreamReader:
    reader = StreamReader()
    for line in lines:
        reader.feed(line)
    return reader


def event(**fields) -> str:
    return "data: " + json.dumps(fields)


def test_a_stream_must_end_with_done():
    chunks = [event(choices=[{"index": 0, "delta": {"content": "hi"}}]),
              event(choices=[{"index": 0, "delta": {}, "finish_reason": "length"}])]
    assert read(chunks + ["data: [DONE]"]).judge(1)[0] == "completed"
    assert read(chunks).judge(1)[0] == "lost"
    assert read(chunks + ["data: [DONE]"]).judge(2)[0] == "invalid"


def test_a_stream_error_event_then_done_is_a_clear_error():
    lines = [event(error={"message": "engine_dead", "type": "x", "code": "engine_dead"}),
             "data: [DONE]"]
    assert read(lines).judge(1) == ("error", "engine_dead: engine_dead")
    assert read(lines[:1]).judge(1)[0] == "lost"
    assert read(["data: {not json", "data: [DONE]"]).judge(1)[0] == "invalid"
