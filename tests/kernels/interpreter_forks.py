"""The child process that runs interpreted kernel checks for tests/kernels/common.py's
`run_interpreted`: started once per test process under the Triton interpreter's
environment, it imports torch and Triton (most of a process's start: ~3-5 s of CPU on CI's
machine, once per check before) and forks a process per check, which imports the check's
module and runs its cases. A check's module state does not reach the next, as when each
check started a process of its own.

Protocol: a line of JSON [module, check, cases] in; a line {"results": [None or a
traceback per case]} or {"results": None, "error": why} out."""
import json
import os
import sys
import traceback

import tests.kernels.common  # noqa: F401  (torch, triton, pytest: what each fork starts with)


def run_in_fork(module: str, check: str, cases: list[dict]) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(2, 1)  # what the check prints or reads stays off the protocol's pipes
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        try:
            from tests.kernels.common import run_cases
            reply = {"results": run_cases(module, check, cases)}
        except BaseException:
            reply = {"results": None, "error": traceback.format_exc()}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(reply))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        return {"results": None, "error": f"the check's process ended with status {status}"}
    return json.loads(text)


def serve() -> None:
    for line in sys.stdin:
        print(json.dumps(run_in_fork(*json.loads(line))), flush=True)


if __name__ == "__main__":
    serve()
