"""Write a bf16 copy of a quantized GGUF with the ``gguf`` package: every quantized tensor
dequantized and stored as BF16 (the 1-D float32 norms stay F32), metadata copied as it is, and
``general.file_type`` set to MOSTLY_BF16. The benchmarks use it so that llama.cpp runs at the
precision lmrpc serves (bf16 weights from the same dequantized values).

    python bench/gguf_bf16.py [--source FILE.gguf] [--out FILE.gguf]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import dequantize, quantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_server.models.source import resolve_model

CACHE = Path.home() / ".cache" / "lmrpc" / "gguf"
KEEP_AS_IS = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


def default_source() -> Path:
    return Path(resolve_model(None).path)


def bf16_path(source: Path) -> Path:
    return CACHE / f"{source.stem.rsplit('.', 1)[0]}.BF16.gguf"


def convert(source: Path, out: Path) -> Path:
    """Write ``out`` (through a temporary file, so a killed run leaves nothing half-written)."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    writer = GGUFWriter(partial, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer adds the header and the architecture itself
        if name == "general.file_type":
            writer.add_file_type(LlamaFileType.MOSTLY_BF16)
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type)
    for tensor in reader.tensors:
        if tensor.tensor_type in KEEP_AS_IS:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        packed = quantize(values, GGMLQuantizationType.BF16)
        writer.add_tensor(tensor.name, packed, raw_shape=packed.shape, raw_dtype=GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(out)
    return out


def ensure_bf16(source: Path) -> Path:
    out = bf16_path(source)
    return out if out.exists() else convert(source, out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", type=Path, default=None, help="default: the embedded SmolLM2 GGUF")
    parser.add_argument("--out", type=Path, default=None, help=f"default: under {CACHE}")
    args = parser.parse_args()
    source = args.source or default_source()
    print(convert(source, args.out or bf16_path(source)))


if __name__ == "__main__":
    main()
