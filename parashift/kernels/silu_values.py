"""silu(gate) * up in fp32 as every kernel that fuses it computes it (the SiLU-and-mul
kernels, the MoE experts' and the down projection's GEMV), rounded as
parashift.layers.activation.silu_and_mul_torch rounds."""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def silu_mul_values(gate, up, LIBDEVICE: tl.constexpr):
    """silu(gate) * up in fp32 of values in the activations' dtype, rounded as
    silu_and_mul_torch rounds: the silu to gate's dtype before the product."""
    g = gate.to(tl.float32)
    # torch's silu is g / (1 + expf(-g)): libdevice's expf and an IEEE division
    # (tl.exp is ex2.approx, `/` div.full); the interpreter has no libdevice
    if LIBDEVICE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = tl.math.div_rn(g, 1.0 + e).to(gate.dtype)
    return silu.to(tl.float32) * up.to(tl.float32)
