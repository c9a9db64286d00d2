"""A parent request folds its children's cumulative outputs: each child's cumulative
logprob is summed as its output grows, equal to the sum over the whole list."""
import random

from parashift.engine.parallel_sampling import ParentRequest, cumulative_logprob, fold_children
from parashift.outputs import CompletionOutput, RequestOutput
from parashift.sampling_params import SamplingParams


def child_output(child_id, tokens, logprobs, finished=False):
    completion = CompletionOutput(0, "", list(tokens), list(logprobs),
                                  "length" if finished else None)
    return RequestOutput(child_id, None, [1, 2], [completion], finished)


def test_growing_outputs_sum_to_the_whole_lists_logprob_exactly():
    rng = random.Random(0)
    parent = ParentRequest("r", SamplingParams(n=2, logprobs=1, max_tokens=300))
    tokens = {child: [] for child in parent.child_ids}
    logprobs = {child: [] for child in parent.child_ids}
    for step in range(300):
        child = parent.child_ids[step % 2]
        for _ in range(rng.randint(1, 3)):  # one step may add several tokens
            token = rng.randrange(1000)
            tokens[child].append(token)
            logprobs[child].append({token: -rng.random() * 5, token + 1: -9.0})
        out = parent.update(child_output(child, tokens[child], logprobs[child]))
        for completion in out.outputs:
            child_id = parent.child_ids[completion.index]
            whole = CompletionOutput(0, "", tokens[child_id], logprobs[child_id])
            assert completion.cumulative_logprob == cumulative_logprob(whole)


def test_a_shorter_output_is_summed_anew():
    parent = ParentRequest("r", SamplingParams(n=2, logprobs=0))
    child = parent.child_ids[0]
    parent.update(child_output(child, [5, 6, 7], [{5: -1.0}, {6: -2.0}, {7: -4.0}]))
    out = parent.update(child_output(child, [5], [{5: -1.0}], finished=True))
    assert out.outputs[0].cumulative_logprob == -1.0


def test_without_logprobs_there_is_no_sum():
    parent = ParentRequest("r", SamplingParams(n=2))
    out = parent.update(RequestOutput(parent.child_ids[1], None, [1], [
        CompletionOutput(0, "", [3, 4], None)]))
    assert out.outputs[0].cumulative_logprob is None


def test_folding_keeps_every_output_of_a_request_of_one_sample():
    """Two delta outputs of a plain request taken in one step (an output process that
    answered two steps at once) both reach the caller, in order, beside a folded parent."""
    parent = ParentRequest("p", SamplingParams(n=2, max_tokens=4, output_kind="delta"))
    first, second = (RequestOutput("plain", None, [1], [CompletionOutput(0, text, [t])])
                     for text, t in (("One", 5), (" day", 6)))
    children = [child_output(child, [7], []) for child in parent.child_ids]
    folded = fold_children([first, children[0], second, children[1]],
                           {child: parent for child in parent.child_ids}, {"p": parent},
                           end=lambda request_id: None)
    assert [o.request_id for o in folded] == ["plain", "p", "plain"]
    assert [o.outputs[0].text for o in folded if o.request_id == "plain"] == ["One", " day"]
    assert sorted(c.index for c in folded[1].outputs) == [0, 1]  # both samples, joined
