"""What the server checks of a request before the engine takes it, by vLLM's server
options: --scheduling-policy fcfs refuses a priority, --max-logprobs caps the logprobs,
--enable-log-requests logs it."""
from parashift.entrypoints.openai.errors import bad_request
from parashift.sampling_params import SamplingParams, check_max_logprobs


def check_admission(ctx, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    priority: int) -> None:
    """400 naming the field the server's options refuse; the request's log line."""
    if priority and ctx.scheduling_policy == "fcfs":
        raise bad_request(f"priority {priority}: this server schedules first come, first "
                          "served (--scheduling-policy fcfs); send priority 0 or start it "
                          "with --scheduling-policy priority", param="priority")
    try:
        check_max_logprobs(params, ctx.max_logprobs)
    except ValueError as exc:
        raise bad_request(str(exc), param=str(exc).split(" ", 1)[0],
                          code="invalid_sampling_params") from None
    if ctx.request_log is not None:
        ctx.request_log.log(request_id, prompt_ids, params)
