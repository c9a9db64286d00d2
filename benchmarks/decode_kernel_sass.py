"""The one-launch decode kernel (attention/triton_decode.py) compiled for sm_90 on the CPU as
the runtime compiles it: the pointers and the strides the runtime sees divisible by 16 marked
so (without those hints every KV load is one element wide and the kernel takes 255 registers
and spills, which no launch does), the metadata arguments generic. For each variant: registers,
stack and local memory a thread (cuobjdump --dump-resource-usage), the SASS floating-point
instruction counts, and whether its SASS is the first variant's.

Variants are NAME=VALUE,... over the 8B decode shape at 64 rows (GROUP 4, BLOCK_M 16, TILE_N 64,
head_dim 128, bf16, PDL early, one split); `num_warps` and `num_stages` are options, the rest
the kernel's constexprs. Session 49 (helper rope64b): the plain kernel 88 registers, the RoPE
fold (removed in session 51) 94, no spills; three stages 116 and 114.

Usage: python benchmarks/decode_kernel_sass.py [--variants default FP8_F16=1 ...] [--output f.json]"""
import argparse
import inspect
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from parashift.attention import triton_decode

SHAPE = dict(GROUP=4, GROUP_P=4, BLOCK_M=16, TILE_N=64, BLOCK_SIZE=16, HEAD_DIM=128,
             HEAD_DIM_P=128, SPLITS_P=1, SPLIT_TOKENS=128, DOT_PRECISION="tf32",
             HEADS_FIRST=False, FP8_PAIRS=False, FP8_F16=False, USE_PDL=1)
POINTERS = {"part_acc_ptr": "fp32", "part_m_ptr": "fp32", "part_l_ptr": "fp32",
            "ticket_ptr": "i32", "block_tables_ptr": "i32", "seq_lens_ptr": "i32",
            "query_start_loc_ptr": "i32"}
GENERIC = {"block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "num_seqs", "token_offset",
           "stride_bt"}  # triton_decode's _jit_generic_in names
FLOATS = {"qk_scale"}
FP_OPS = re.compile(r"\b(FFMA|FMUL|FADD|HMMA\.\w+|MUFU\.\w+|LDGSTS|BAR\.SYNC)\b")
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_variant(settings: dict) -> bytes:
    """The cubin of the kernel with `settings` (constexprs; num_warps, num_stages)."""
    kernel = triton_decode.decode_attention_kernel
    options = {"num_warps": settings.pop("num_warps", 4),
               "num_stages": settings.pop("num_stages", 2), "launch_pdl": True}
    constants = {**SHAPE, **settings}
    signature, attrs = {}, {}
    for index, name in enumerate(inspect.signature(kernel.fn).parameters):
        if name in constants:
            signature[name] = "constexpr"
            continue
        is_pointer = name.endswith("_ptr")
        signature[name] = ("*" + POINTERS.get(name, "bf16") if is_pointer
                           else "fp32" if name in FLOATS else "i32")
        if name not in GENERIC and name not in FLOATS:
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]


def cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(TOOLS, "cuobjdump"), flag, f.name],
                              capture_output=True, text=True, check=True).stdout


def parse(variant: str) -> dict:
    if variant == "default":
        return {}
    settings = {}
    for item in variant.split(","):
        name, value = item.split("=")
        settings[name] = {"True": True, "False": False}.get(value, value)
        if settings[name] == value and value.lstrip("-").isdigit():
            settings[name] = int(value)
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+",
                        default=["default", "num_stages=3", "FP8_F16=True"])
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default in 3.9
    rows, first = [], None
    for variant in args.variants:
        cubin = compile_variant(parse(variant))
        usage = dict(re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)",
                                cuobjdump(cubin, "--dump-resource-usage")))
        sass = [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip()
                for line in cuobjdump(cubin, "-sass").splitlines()
                if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
        counts = {}
        for op in FP_OPS.findall("\n".join(sass)):
            counts[op] = counts.get(op, 0) + 1
        first = sass if first is None else first
        rows.append({"variant": variant, **{k.lower(): int(v) for k, v in usage.items()},
                     "sass_ops": counts, "instructions": len(sass),
                     "same_sass_as_first": sass == first})
        print(json.dumps(rows[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
