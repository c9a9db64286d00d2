"""lm-evaluation-harness against the server, offline (docs/evaluation.md): `lm_eval run
--model local-completions` on the committed multiple-choice task scores each choice by
loglikelihood (/v1/completions with echo and logprobs, prompts batched, tokenized through
/tokenize), and its accuracy equals the offline LLM's ranking of the same items by their
prompt logprobs; `--model local-chat-completions` runs the generate task."""
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parashift import LLM, SamplingParams
from tests.conftest import requires_smollm2

pytestmark = requires_smollm2
ROOT = Path(__file__).parents[3]
TASKS = ROOT / "benchmarks" / "lm_eval_tasks"


def run_lm_eval(server, served: str, tmp_path, model: str, endpoint: str, task: str,
                *options) -> dict:
    """The task's results and samples, from the `lm_eval` command line (its index of
    built-in tasks left out: tests/helpers/lm_eval_own_tasks.py)."""
    model_args = (f"model={served},base_url={server.base_url}{endpoint}"
                  + (",tokenizer_backend=remote" if model == "local-completions" else ""))
    command = [sys.executable, "-m", "tests.helpers.lm_eval_own_tasks", "run", "--model", model,
               "--model_args", model_args, "--tasks", task, "--include_path", str(TASKS),
               "--output_path", str(tmp_path), "--log_samples", *options]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(Path(glob.glob(f"{tmp_path}/**/results_*.json",
                                        recursive=True)[0]).read_text())
    samples = [json.loads(line) for path in glob.glob(f"{tmp_path}/**/samples_{task}_*.jsonl",
                                                      recursive=True)
               for line in Path(path).read_text().splitlines()]
    return {"results": results["results"][task], "samples": samples}


@pytest.fixture(scope="module")
def offline():
    llm = LLM(device="cpu", dtype="float32", max_model_len=512, num_blocks=128)
    yield llm
    llm.shutdown()


def items(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS / name).read_text().splitlines() if line]


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a request into context and continuation tokens (a context's
    trailing spaces go to the continuation; the whole is encoded, then cut)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    return context_ids, whole[len(context_ids):]


def offline_loglikelihoods(llm, doc: dict) -> list[float]:
    """Each choice's summed logprob after the question, from the prompt logprobs."""
    context = f"Question: {doc['question']}\nAnswer:"
    pairs = [encode_pair(llm.llm_engine.tokenizer, context, " " + c) for c in doc["choices"]]
    outputs = llm.generate([c + x for c, x in pairs],
                           SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    return [sum(out.prompt_logprobs[i][out.prompt_token_ids[i]].logprob
                for i in range(len(c), len(c) + len(x))) for out, (c, x) in zip(outputs, pairs)]


def test_multiple_choice_accuracy_equals_the_offline_ranking(server, model_name, offline,
                                                            tmp_path):
    run = run_lm_eval(server, model_name, tmp_path, "local-completions", "/v1/completions",
                      "parashift_mc", "--batch_size", "4")
    docs = items("parashift_mc.jsonl")
    assert run["results"]["sample_len"] == len(docs)
    served = {s["doc_id"]: [float(r[0][0]) for r in s["resps"]] for s in run["samples"]}
    correct = 0
    for doc_id, doc in enumerate(docs):
        ours = offline_loglikelihoods(offline, doc)
        assert served[doc_id] == pytest.approx(ours, abs=1e-3)
        correct += max(range(len(ours)), key=ours.__getitem__) == doc["answer"]
    assert run["results"]["acc,none"] == pytest.approx(correct / len(docs))


def test_generate_task_over_chat_completions(server, model_name, offline, tmp_path):
    run = run_lm_eval(server, model_name, tmp_path, "local-chat-completions", "/v1/chat/completions",
                      "parashift_gen", "--apply_chat_template")
    docs = items("parashift_gen.jsonl")
    replies = offline.chat([[{"role": "user", "content": f"{d['question']} Answer with one "
                              "word."}] for d in docs],
                           SamplingParams(temperature=0, max_tokens=8, stop=["\n"]))
    served = {s["doc_id"]: s["resps"][0][0] for s in run["samples"]}
    assert [served[i] for i in range(len(docs))] == [r.outputs[0].text for r in replies]
    last_words = [r.outputs[0].text.rstrip(". ").split()[-1].lower() for r in replies]
    expected = sum(w == d["answer"].lower() for w, d in zip(last_words, docs)) / len(docs)
    assert run["results"]["exact_match,last_word"] == pytest.approx(expected)
