from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
