"""Portable weight transport: ``<root>/v<version>/model.safetensors`` on a shared filesystem.

Slower than shared memory (a file write and a file read per version) but works across hosts
that mount the same ``root``. A version is written into a temporary directory and renamed
into place, so a reader either sees the whole version or none of it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from forge.weights.store import (
    TensorMeta,
    WeightHandle,
    WeightTransport,
    check_into_keys,
    copy_into,
)

__all__ = ["SafetensorsDirTransport", "read_safetensors_dir"]

FILENAME = "model.safetensors"
_ORDER_KEY = "forge_param_order"


def _unshared_contiguous(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, cloning any that share storage (safetensors refuses aliases,
    and HF models with tied embeddings have them)."""
    out, seen = {}, set()
    for name, t in state_dict.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        elif ptr is not None:
            seen.add(ptr)
        out[name] = t
    return out


def _read_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header["__header_len__"] = length
    return header


def _manifest_from_file(path: Path) -> dict[str, TensorMeta]:
    """Manifest with absolute byte offsets, read from the safetensors header."""
    header = _read_header(path)
    length = header.pop("__header_len__")
    header.pop("__metadata__", None)
    dtypes = {
        "F64": "float64",
        "F32": "float32",
        "F16": "float16",
        "BF16": "bfloat16",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U8": "uint8",
        "BOOL": "bool",
    }
    manifest = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        start, end = info["data_offsets"]
        dtype = dtypes.get(info["dtype"], info["dtype"])
        manifest[name] = TensorMeta(dtype, tuple(info["shape"]), 8 + length + start, end - start)
    return manifest


def read_safetensors_dir(
    location: str,
    version: int,
    into: dict[str, torch.Tensor] | None = None,
    wait_s: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Load ``<location>/model.safetensors`` into ``into`` (returned) or fresh tensors.

    Waits up to ``wait_s`` seconds for the file, then raises ``FileNotFoundError`` naming the
    version and the path.
    """
    path = Path(location) / FILENAME
    deadline = time.monotonic() + wait_s
    while not path.is_file():
        if time.monotonic() >= deadline:
            raise FileNotFoundError(
                f"weight version {version} not found: {path} does not exist (waited "
                f"{wait_s:g}s). It was never pushed, was dropped, or `root` is not the "
                "pusher's shared directory"
            )
        time.sleep(0.05)
    loaded = load_file(str(path))
    # safetensors stores tensors sorted by dtype and name; restore the pusher's order.
    order = json.loads(_read_header(path).get("__metadata__", {}).get(_ORDER_KEY, "[]"))
    if sorted(order) == sorted(loaded):
        loaded = {name: loaded[name] for name in order}
    if into is None:
        return loaded
    check_into_keys(into, list(loaded), f"weight version {version}")
    for name, src in loaded.items():
        copy_into(into, name, src, f"weight version {version}")
    return into


class SafetensorsDirTransport(WeightTransport):
    """Weights in ``<root>/v<version>/model.safetensors``.

    Args:
        root: directory shared by pusher and pullers (created if missing).
        wait_s: how long ``pull(version)`` waits for a version to appear.
    """

    name = "safetensors_dir"

    def __init__(self, root: str | os.PathLike, wait_s: float = 0.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.wait_s = wait_s

    def path(self, version: int) -> Path:
        """Directory holding ``version``."""
        return self.root / f"v{int(version)}"

    def push(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        final = self.path(version)
        if final.exists():
            raise ValueError(f"weight version {version} already exists at {final}; drop it first")
        tmp = self.root / f".v{int(version)}.tmp-{os.getpid()}-{id(self)}"
        tmp.mkdir()
        try:
            metadata = {_ORDER_KEY: json.dumps(list(state_dict))}
            save_file(_unshared_contiguous(state_dict), str(tmp / FILENAME), metadata=metadata)
            manifest = _manifest_from_file(tmp / FILENAME)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # The file lists tensors sorted by name; keep the caller's order in the handle.
        manifest = {name: manifest[name] for name in state_dict}
        return WeightHandle(version, self.name, str(final), manifest)

    def pull(
        self,
        handle_or_version: WeightHandle | int,
        into: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        if isinstance(handle_or_version, WeightHandle):
            h = handle_or_version
            return read_safetensors_dir(h.location, h.version, into, self.wait_s)
        version = int(handle_or_version)
        return read_safetensors_dir(str(self.path(version)), version, into, self.wait_s)

    def drop(self, version: int) -> None:
        shutil.rmtree(self.path(version), ignore_errors=True)

    def versions(self) -> list[int]:
        names = (p.name for p in self.root.iterdir() if p.is_dir())
        return sorted(int(n[1:]) for n in names if n.startswith("v") and n[1:].isdigit())
