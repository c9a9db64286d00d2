"""OpenAI-compatible HTTP server (FastAPI + uvicorn)."""
