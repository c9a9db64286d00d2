"""`python -m tests.helpers.lm_eval_own_tasks run ...`: lm-eval's command line as
`lm_eval run ...`, its task index holding only the --include_path tasks. Indexing lm-eval's
thousands of built-in task files takes ~15 s of CPU a run; the committed tasks use none."""
import functools

from lm_eval.__main__ import cli_evaluate
from lm_eval.tasks import TaskManager

TaskManager.__init__ = functools.partialmethod(TaskManager.__init__, include_defaults=False)

if __name__ == "__main__":
    cli_evaluate()
