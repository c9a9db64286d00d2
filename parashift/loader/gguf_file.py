"""A GGUF file's header (metadata and tensor table), parsed once with `struct`
over a memory map, and its tensors dequantized to float32 on demand.

gguf.GGUFReader builds a numpy view per metadata item (seconds for a 49k-token
vocabulary); this reader parses the same header in about a tenth of a second.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md"""
import mmap
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                  10: "<Q", 11: "<q", 12: "<d"}
NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
               6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: slowest-moving dimension first
    ggml_type: int
    offset: int             # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    metadata: dict
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return self.metadata.get("general.architecture", "")

    def arch_field(self, key: str, default=None):
        """`<architecture>.<key>`, e.g. arch_field("block_count")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


class _Cursor:
    """Reads little-endian values from a buffer, front to back."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.unpack("<Q")
        if self.pos + size > len(self.buf):
            raise ValueError("string runs past the end of the file")
        text = bytes(self.buf[self.pos:self.pos + size]).decode("utf-8", errors="replace")
        self.pos += size
        return text

    def value(self, value_type: int):
        if value_type == STRING:
            return self.string()
        if value_type == ARRAY:
            return self.array()
        if value_type not in SCALAR_FORMATS:
            raise ValueError(f"unknown metadata value type {value_type}")
        return self.unpack(SCALAR_FORMATS[value_type])

    def array(self) -> list:
        item_type, count = self.unpack("<I"), self.unpack("<Q")
        if item_type in NUMPY_TYPES:
            dtype = np.dtype(NUMPY_TYPES[item_type]).newbyteorder("<")
            values = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += values.nbytes
            return values.tolist()
        return [self.value(item_type) for _ in range(count)]


def _open_map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # mmap refuses empty files
            raise ValueError(f"cannot read GGUF file {path}: the file is empty") from None


def _close(buf: mmap.mmap) -> None:
    try:
        buf.close()
    except BufferError:  # a numpy view still exists (e.g. in a traceback); the GC closes it
        pass


def _tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return int(np.prod(shape)) // block_size * type_size


def _parse(path: Path, buf) -> GGUFHeader:
    cur = _Cursor(buf)
    if bytes(buf[:4]) != MAGIC:
        raise ValueError("not a GGUF file (it does not start with b'GGUF')")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} is not supported; supported: {VERSIONS}")
    num_tensors, num_fields = cur.unpack("<Q"), cur.unpack("<Q")
    metadata = {}
    for _ in range(num_fields):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("<I"))
    table = []
    for _ in range(num_tensors):
        name = cur.string()
        dims = struct.unpack_from(f"<{cur.unpack('<I')}Q", buf, cur.pos)
        cur.pos += 8 * len(dims)
        table.append((name, tuple(reversed(dims)), cur.unpack("<I"), cur.unpack("<Q")))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    data_start = -(-cur.pos // alignment) * alignment
    tensors = {name: TensorInfo(name, shape, ggml_type, data_start + offset,
                                _tensor_nbytes(ggml_type, shape))
               for name, shape, ggml_type, offset in table}
    return GGUFHeader(path, metadata, tensors)


def _check_extent(header: GGUFHeader, file_size: int) -> None:
    for t in header.tensors.values():
        if t.offset + t.nbytes > file_size:
            raise ValueError(f"GGUF file {header.path} is truncated: tensor {t.name} ends at byte "
                             f"{t.offset + t.nbytes}, the file has {file_size} bytes")


@lru_cache(maxsize=4)
def _read_header_cached(path: Path, mtime_ns: int, size: int) -> GGUFHeader:
    buf = _open_map(path)
    try:
        header = _parse(path, buf)
    except ValueError as e:
        raise ValueError(f"cannot read GGUF file {path}: {e}") from None
    except (struct.error, IndexError, OverflowError, KeyError) as e:
        raise ValueError(f"cannot read GGUF file {path}: truncated or corrupt header ({e})") from None
    finally:
        _close(buf)
    _check_extent(header, size)
    return header


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """The parsed header of `path`, cached while the file is unchanged (the config
    and the weights loader both ask for it)."""
    path = Path(path).resolve()
    stat = path.stat()
    return _read_header_cached(path, stat.st_mtime_ns, stat.st_size)


class GGUFTensorReader:
    """Dequantizes tensors of one file to float32 numpy arrays."""

    def __init__(self, header: GGUFHeader):
        self.header = header
        self._buf = _open_map(header.path)

    def __enter__(self) -> "GGUFTensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self._buf = None  # arrays handed out may still view the map; the GC closes it

    def read(self, name: str) -> np.ndarray:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize, quant_shape_to_byte_shape
        info = self.header.tensors[name]
        qtype = GGMLQuantizationType(info.ggml_type)
        raw = np.frombuffer(self._buf, np.uint8, info.nbytes, info.offset)
        raw = raw.reshape(quant_shape_to_byte_shape(info.shape, qtype))
        return dequantize(raw, qtype).reshape(info.shape)
