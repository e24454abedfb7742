"""Load HF causal LMs and tokenizers from a local directory or a hub id.

Attention runs with ``attn_implementation="eager"`` by default. Generation (incremental, KV
cache, left padding) and teacher-forced logprob recomputation (full sequence, right padding)
then use the same plain matmul + softmax kernels, and in float32 they agree to ~1e-6. SDPA
agrees about as well on CPU, but its fused kernels differ by backend and shape, so eager is the
deterministic choice for the tiny models this is used with; pass ``attn_implementation="sdpa"``
for speed on real models.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
# "name" or "org/name" as the hub accepts them; anything else can only be a local path.
_HUB_ID_RE = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def resolve_dtype(dtype: Any):
    """Map ``"float32"``/``"bfloat16"``/``"float16"`` (or a ``torch.dtype``) to a torch dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype: {dtype!r}; choose one of {list(DTYPES)}")
    return getattr(torch, dtype)


def _looks_like_path(s: str) -> bool:
    return os.path.isabs(s) or s.startswith((".", "~")) or not _HUB_ID_RE.match(s)


def _missing_model_error(path_or_id: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"no model directory at {path_or_id!r} (and it is not a hub id, or the hub is "
        f"unreachable). Build a small local model with `forge make-tiny-model {path_or_id}` "
        "or `forge.models.make_tiny_model(path)`."
    )


def local_source(path_or_id: str | os.PathLike) -> str:
    """``path_or_id`` as a string to load from on this host: a hub id as is; a GGUF file or a
    shipped model's name (``forge.models.gguf``) as its converted directory; a path that
    exists here as is; a path of the controller's host that does not exist here (a worker on
    another host) staged from there (``controller.files``). Raises ``FileNotFoundError`` for a
    path found nowhere."""
    s = os.fspath(path_or_id)
    from forge.models.gguf import is_model_spec, resolve_model

    if is_model_spec(s):  # a GGUF file or a shipped model's name: its converted directory
        return resolve_model(s)
    if Path(s).expanduser().exists():
        return str(Path(s).expanduser())
    if isinstance(path_or_id, Path) or _looks_like_path(s):
        from controller import files

        try:
            staged = files.stage_sync(str(Path(s).expanduser().absolute()))
        except FileNotFoundError:
            staged = ""
        if not staged or not os.path.exists(staged):
            raise _missing_model_error(s)
        return staged
    return s


def check_architecture(path_or_id: str) -> None:
    """``ValueError`` when a local model directory's ``config.json`` names a ``model_type``
    this transformers cannot build (raised when the config loads, before anything spawns).
    Hub ids and paths of other hosts are checked where they load."""
    config = Path(path_or_id).expanduser() / "config.json"
    if not config.is_file():
        return
    import json

    from transformers import __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError) as e:
        raise ValueError(f"{config} is not readable JSON ({e}): is it a model directory?") from e
    if model_type is not None and model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"{path_or_id}: model_type {model_type!r} is unknown to transformers {__version__}; "
            "upgrade transformers if a newer release has it (Forge loads what transformers "
            "loads, then checks it: docs/models.md), or convert the model to a known "
            "architecture"
        )


def check_tokenizer(path_or_id: str) -> None:
    """``ValueError`` when a local model directory's tokenizer has a BOS or EOS id that its
    ``config.json`` does not (``check_special_ids``); raised when the config
    loads. Directories without both files, hub ids and other hosts' paths are left alone."""
    path = Path(path_or_id).expanduser()
    if not (path / "config.json").is_file() or not (path / "tokenizer_config.json").is_file():
        return
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    check_special_ids(config, AutoTokenizer.from_pretrained(path), str(path))


def load_model(
    path_or_id: str | os.PathLike,
    dtype: Any = "float32",
    device: str = "cpu",
    attn_implementation: str = "eager",
):
    """Load an ``AutoModelForCausalLM`` in eval mode on ``device``, and check once whether
    its logprobs may use the chunked head (``forge.models.logprobs.check_split_head``).

    Raises:
        FileNotFoundError: ``path_or_id`` is a path that does not exist, or a hub id that
            cannot be fetched; the message says how to build a tiny local model.
        ValueError: unknown ``dtype``.
    """
    from transformers import AutoModelForCausalLM

    torch_dtype = resolve_dtype(dtype)
    source = local_source(path_or_id)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, attn_implementation=attn_implementation
        )
    except OSError as e:
        raise _missing_model_error(source) from e
    model = model.to(device).eval()
    from forge.models.logprobs import check_split_head

    # Decide once, here, whether logprobs may use the memory-saving chunked head: only if it
    # gives exactly the model's own logits (a post-scaling in forward would be lost).
    check_split_head(model)
    return model


def load_tokenizer(path_or_id: str | os.PathLike):
    """Load the ``AutoTokenizer`` saved with a model; errors as in ``load_model``."""
    from transformers import AutoTokenizer

    source = local_source(path_or_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as e:
        raise _missing_model_error(source) from e
    if tokenizer.pad_token_id is None:
        # Batched generation and padding need a pad id; eos is the usual stand-in.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_special_ids(config: Any, tokenizer: Any, where: str) -> None:
    """``ValueError`` when the tokenizer's BOS or EOS id is not the model config's (a
    tokenizer saved with another model, or a conversion that renumbered it)."""
    text = getattr(config, "get_text_config", lambda: config)()
    eos = getattr(text, "eos_token_id", None)
    eos_ids = set(eos) if isinstance(eos, (list, tuple)) else {eos} - {None}
    checks = [("bos_token_id", {getattr(text, "bos_token_id", None)} - {None}), ("eos", eos_ids)]
    for name, want in checks:
        got = getattr(tokenizer, "bos_token_id" if name == "bos_token_id" else "eos_token_id")
        if want and got is not None and got not in want:
            raise ValueError(
                f"{where}: the tokenizer's {name.replace('_token_id', '')} id is {got} but the "
                f"model's config says {sorted(want)}: the tokenizer belongs to another model or "
                "was renumbered; save the model's own tokenizer beside it"
            )
