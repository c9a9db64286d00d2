"""The rows an op quantized for the FP8 layer after it, held between the two calls
(layers/fp8_input.py, layers/fp8_attention_output.py)."""
import torch


class FP8Handoff:
    """The rows one producer quantized for its consumer, held from the producer's return to
    the consumer's call (taken once, so a step's activations are not kept)."""

    def __init__(self):
        self._held: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def put(self, source: torch.Tensor, rows: torch.Tensor, scales: torch.Tensor) -> None:
        self._held = (source, rows, scales)

    def take(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(E4M3 rows, fp32 scales [rows, 1]) if x is the tensor they were made of."""
        held, self._held = self._held, None
        if held is None or not self.made_of(held[0], x):
            return None
        return held[1], held[2]

    @staticmethod
    def made_of(source: torch.Tensor, x: torch.Tensor) -> bool:
        """Whether x is the tensor the rows were made of (`source`)."""
        return x is source


class FlattenedHandoff(FP8Handoff):
    """A handoff whose consumer takes the producer's output with its last two dimensions
    flattened: the rows are taken for that output or a view of it so flattened."""

    @staticmethod
    def made_of(source: torch.Tensor, x: torch.Tensor) -> bool:
        """x is source, or source (contiguous) viewed flattened over its last two dimensions."""
        if x is source:
            return True
        return (x._base is source and source.is_contiguous() and x.is_contiguous()
                and x.shape == (*source.shape[:-2], source.shape[-2] * source.shape[-1]))
