"""Per-step state that layers read instead of taking it as arguments."""
from contextlib import contextmanager
from dataclasses import dataclass

from parashift.attention.backend import AttentionBackend
from parashift.attention.metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    backend: AttentionBackend


_context: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _context is None:
        raise RuntimeError("no forward context: layers run only inside a model runner step")
    return _context


@contextmanager
def forward_context(ctx: ForwardContext):
    global _context
    saved, _context = _context, ctx
    try:
        yield ctx
    finally:
        _context = saved
