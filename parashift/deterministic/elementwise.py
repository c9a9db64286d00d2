"""Element-wise functions whose value does not depend on where an element sits.

torch's CPU kernels run the vectorized code on whole vectors and scalar code on a loop's
remainder, and the two SiLUs (sigmoids) differ in the last bit; the remainder moves with
the tensor's size and the thread split. exp, division and products agree in both (IEEE
or measured), so SiLU is written with them."""
import torch


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up], in fp32 rounded to x's dtype once."""
    gate, up = x.float().chunk(2, dim=-1)
    return (gate / (1.0 + torch.exp(-gate)) * up).to(x.dtype)
