"""Turn a model name into a ready (model, tokenizer) pair: on a device, in a dtype, in eval mode.

A name is tried, in order, as:
1. ``tiny-<arch>[-L<layers>-H<hidden>][-<tokenizer>]``: a seeded random model from `fedtune.models.tiny`
   (tokenizer: ``bpe`` or ``spm``; none for the byte-level one);
2. a zoo name (`fedtune.models.zoo`): fetched and converted once, then loaded from the cache;
3. a model made by ``fedtune models derive`` (`fedtune.train.distill`), in ``<cache>/derived/<name>/``;
4. a local Hugging Face directory (with ``gguf_file=``: a GGUF file inside it, converted once);
5. a path to a ``.gguf`` file, converted once into the cache (keyed by the file's sha256);
6. a Hugging Face Hub id, which needs network access or a copy in the local hub cache.

``quantization`` 4 or 8 loads any of them with bitsandbytes (``quantization_config``) as the frozen
base of a QLoRA: its linear layers quantised, the rest in ``dtype`` and frozen (`prepare_quantized`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from fedtune.models.tiny import TINY_ARCHS, TINY_TOKENIZERS, tiny_model, tiny_tokenizer
from fedtune.models.zoo import convert_gguf_cached, default_cache_dir, fetch, get_entry, zoo_names
from fedtune.suggest import closest

ModelKind = Literal["causal-lm", "encoder"]
PaddingSide = Literal["left", "right"]

# Encoder-only families: transformers maps some of them to a causal-LM head too, which would load an
# untrained decoder head without complaint.
ENCODER_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "mpnet"}
)
_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
_TINY_NAME = re.compile(
    r"tiny-(?P<arch>[a-z0-9]+)(?:-L(?P<layers>\d+)-H(?P<hidden>\d+))?(?:-(?P<tokenizer>[a-z0-9]+))?"
)
# Derived models live in <cache>/derived/<name>/; the record file, written last, marks one as complete.
DERIVED_DIR = "derived"
DERIVED_MARKER = "derive.json"
_DERIVED_NAME = re.compile(r"(?P<source>.+)-l(?P<layers>\d+)")


class ModelError(ValueError):
    """A model name, directory, device or dtype that cannot be loaded, with what to do instead."""


@dataclass(frozen=True)
class TinySpec:
    arch: str
    num_layers: int = 2
    hidden: int = 32
    tokenizer: str = "byte"


def parse_tiny_name(name: str) -> TinySpec | None:
    """``tiny-llama`` -> TinySpec("llama"); ``tiny-qwen2-L4-H64`` -> 4 layers of width 64;
    ``tiny-llama-spm`` -> the SentencePiece style tokenizer; a name not starting with tiny- -> None."""
    if not name.startswith("tiny-"):
        return None
    match = _TINY_NAME.fullmatch(name)
    if match is None or match["arch"] not in TINY_ARCHS:
        raise ModelError(
            f"bad tiny model name {name!r}: use tiny-<arch>[-L<layers>-H<hidden>][-<tokenizer>] "
            f"with arch one of {', '.join(TINY_ARCHS)}"
        )
    tokenizer = match["tokenizer"] or "byte"
    if tokenizer not in TINY_TOKENIZERS:
        raise ModelError(
            f"bad tiny model name {name!r}: unknown tokenizer suffix -{tokenizer}; valid suffixes: "
            f"{', '.join('-' + family for family in TINY_TOKENIZERS)} (none: byte)"
        )
    if match["layers"] is None:
        return TinySpec(match["arch"], tokenizer=tokenizer)
    spec = TinySpec(match["arch"], int(match["layers"]), int(match["hidden"]), tokenizer)
    # tiny.py gives every attention head a width of 16.
    if spec.num_layers < 1 or spec.hidden < 16 or spec.hidden % 16:
        raise ModelError(
            f"bad tiny model name {name!r}: needs >= 1 layer and a hidden size that is a multiple of 16"
        )
    return spec


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the CUDA GPU if there is one, else the CPU; otherwise any torch device string."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ModelError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:<index>") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} asked for, but torch sees no CUDA GPU here; use auto or cpu")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on a GPU that supports it, float32 otherwise; or fp32 / bf16 / fp16."""
    if dtype == "auto":
        on_bf16_gpu = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if on_bf16_gpu else torch.float32
    if dtype not in _DTYPES:
        close = closest(dtype, [*_DTYPES, "auto"])
        hint = f"; did you mean {close!r}?" if close else ""
        raise ModelError(f"unknown dtype {dtype!r}{hint} (use auto, fp32, bf16 or fp16)")
    return _DTYPES[dtype]


def looks_like_path(name: str) -> bool:
    # Hub ids are "name" or "owner/name"; anything else path-shaped is meant as a local path.
    return name.startswith(("/", ".", "~")) or name.endswith(".gguf") or name.count("/") > 1


def _local_dir(path: Path, gguf_file: str | None, cache_dir: Path | None) -> Path:
    if gguf_file is not None:
        return convert_gguf_cached(path / gguf_file, cache_dir)
    if not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"; it holds {', '.join(ggufs)}: pass gguf_file=" if ggufs else ""
        raise ModelError(f"{path} is not a Hugging Face model directory: it has no config.json{hint}")
    return path


def _hub_gguf(repo_id: str, gguf_file: str, cache_dir: Path | None) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        local_file = hf_hub_download(repo_id, gguf_file)
    except (OSError, ValueError) as err:
        raise _not_found(repo_id, err) from err
    return convert_gguf_cached(Path(local_file), cache_dir)


def derived_path(name: str, cache_dir: Path | None = None) -> Path | None:
    """The directory of the derived model ``name`` (`fedtune.models.derived`), or None if there is none."""
    if not name or "/" in name or name.startswith("."):
        return None
    directory = (cache_dir or default_cache_dir()) / DERIVED_DIR / name
    return directory if (directory / DERIVED_MARKER).is_file() else None


def _check_not_underived(name: str, cache_dir: Path | None) -> None:
    """``<zoo name>-l<N>`` is the default name of a derived model: say how to make it."""
    match = _DERIVED_NAME.fullmatch(name)
    if match is not None and match["source"] in zoo_names():
        cache_option = f" --cache-dir {cache_dir}" if cache_dir is not None else ""
        raise ModelError(
            f"{name} is not derived yet: run `fedtune models derive {match['source']} "
            f"--layers {match['layers']}{cache_option}`"
        )


def resolve_source(
    name: str, kind: ModelKind, cache_dir: Path | None = None, gguf_file: str | None = None
) -> Path | str:
    """Where ``from_pretrained`` should load a non-tiny ``name`` from: a local directory or a hub id."""
    if name in zoo_names():
        entry = get_entry(name)
        if kind == "causal-lm" and entry.kind != kind:
            raise ModelError(f"{name} is an {entry.kind}, not a causal LM: use load_encoder_classifier")
        return fetch(entry, cache_dir)
    derived = derived_path(name, cache_dir)
    if derived is not None:
        return derived
    _check_not_underived(name, cache_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        return _local_dir(path, gguf_file, cache_dir)
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf_cached(path, cache_dir)
    if looks_like_path(name):
        raise ModelError(f"no model directory or .gguf file at {path}")
    if gguf_file is not None:
        return _hub_gguf(name, gguf_file, cache_dir)
    return name


def _not_found(name: str, err: BaseException) -> ModelError:
    from huggingface_hub.constants import is_offline_mode

    known = [*zoo_names(), *(f"tiny-{arch}" for arch in TINY_ARCHS)]
    close = closest(name, known, cutoff=0.4)
    hint = f" Did you mean {close!r}?" if close else ""
    where = (
        "in the local Hugging Face cache (offline mode: HF_HUB_OFFLINE is set)"
        if is_offline_mode()
        else "on the Hugging Face Hub"
    )
    return ModelError(
        f"{name!r} is not a tiny model, a zoo model, a local directory or a .gguf file, and was not found "
        f"{where}.{hint} Zoo models: {', '.join(zoo_names())}; tiny models: "
        f"tiny-<arch>[-L<layers>-H<hidden>][-<tokenizer>] with arch one of {', '.join(TINY_ARCHS)}. "
        f"({type(err).__name__}: {str(err).splitlines()[0]})"
    )


def _load_config(source: Path | str, name: str, kind: ModelKind) -> Any:
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as err:
        if isinstance(source, Path):
            raise
        raise _not_found(name, err) from err
    if kind == "causal-lm" and config.model_type in ENCODER_MODEL_TYPES:
        raise ModelError(
            f"{name} is a {config.model_type} encoder, not a causal LM: use load_encoder_classifier"
        )
    return config


def _finish(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
    dtype: torch.dtype,
    padding_side: PaddingSide | None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Pad token, padding side, device, dtype and eval mode, the same for every source (a quantised
    model was loaded onto its device in its dtype: transformers refuses to cast it)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError("the tokenizer has neither a pad nor an eos token to pad batches with")
        # Padding is masked out of attention and loss, so reusing eos costs nothing.
        tokenizer.pad_token = tokenizer.eos_token
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and generation_config.pad_token_id is None:
        generation_config.pad_token_id = tokenizer.pad_token_id
    if not getattr(model, "is_quantized", False):
        model.to(device=device, dtype=dtype)  # type: ignore[call-arg]  # transformers' wrapper confuses mypy
    return model.eval(), tokenizer


def _placement(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """The torch device and dtype that ``device`` and ``dtype`` (each may be ``auto``) name."""
    torch_device = resolve_device(device)
    return torch_device, resolve_dtype(dtype, torch_device)


def _tiny(
    spec: TinySpec, seed: int, *, num_labels: int = 2, classifier: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The seeded random model and tokenizer ``spec`` names (with ``classifier``: a sequence classifier)."""
    return tiny_model(
        spec.arch,
        num_layers=spec.num_layers,
        hidden=spec.hidden,
        num_labels=num_labels,
        seed=seed,
        tokenizer=tiny_tokenizer(spec.tokenizer),
        classifier=classifier,
    )


def _pretrained_source(
    name: str, kind: ModelKind, cache_dir: Path | None, gguf_file: str | None, seed: int
) -> Path | str:
    """`resolve_source` with the config checked to be of a ``kind``, and torch seeded for what
    ``from_pretrained`` initialises (a head the checkpoint lacks)."""
    source = resolve_source(name, kind, cache_dir, gguf_file)
    _load_config(source, name, kind)
    torch.manual_seed(seed)
    return source


QUANTIZATION_BITS = (4, 8)


def quantization_config(bits: int, compute_dtype: torch.dtype) -> Any:
    """transformers' ``BitsAndBytesConfig`` for ``bits``: 4 = NF4 with double quantisation (QLoRA's
    recipe), its matmuls in ``compute_dtype``; 8 = LLM.int8 (outlier features kept in fp16)."""
    if bits not in QUANTIZATION_BITS:
        raise ModelError(f"model.quantization {bits!r}: use 4, 8 or null")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise ModelError(
            f"model.quantization {bits} needs bitsandbytes, which is not installed: "
            "pip install 'fedtune[quant]'"
        ) from err
    from transformers import BitsAndBytesConfig

    if bits == 4:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


class _DropInt8CastNotice(logging.Filter):
    """bitsandbytes logs that LLM.int8 casts its input to fp16 on every matmul call; that is how int8
    works, not news, and it would flood a run's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("MatMul8bitLt: inputs will be cast")


_INT8_NOTICE = _DropInt8CastNotice()


def prepare_quantized(model: PreTrainedModel) -> PreTrainedModel:
    """A bitsandbytes-loaded model made ready to be a QLoRA base (peft's
    ``prepare_model_for_kbit_training``: every weight frozen, half-precision norms and embeddings in
    fp32; gradient checkpointing is ``train.gradient_checkpointing``'s, not switched on here).

    bitsandbytes 0.50's CPU backend repacks a 4-bit weight into an inference-only layout (on CPUs with
    AVX512-BF16) the first time the layer runs in eval mode without gradients, and from then on its
    matmul has no backward: gradients stop at that layer and a LoRA trained after an evaluation would
    silently stop learning. The repacking is switched off, so evaluation and training share one layout.

    The weights left unquantised (embeddings, norms, head) stay views of the checkpoint's memory map, as
    in an unquantised load: file pages the kernel can drop and re-read, not process memory (copying them
    out would turn them into anonymous memory and add their size to the loading peak). The pages that
    quantising read are handed back (`_page_out`): the process's RSS is the quantised model's.
    """
    from peft import prepare_model_for_kbit_training

    layer: Any
    for layer in model.modules():
        if hasattr(layer, "support_avx512bf16_for_cpu"):
            layer.support_avx512bf16_for_cpu = False
    logging.getLogger("bitsandbytes.autograd._functions").addFilter(_INT8_NOTICE)
    prepared: PreTrainedModel = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    _return_freed_memory()
    return prepared


MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim the range's pages; mapped file pages are re-read when touched


def _page_out(directory: Path) -> None:
    """Hand back the resident pages of the checkpoint files under ``directory`` that this process maps
    (read while quantising, never again: only the unquantised weights' pages come back, on first use).
    Nothing is lost: clean file pages are re-read, written ones stay. A no-op off Linux."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    prefix = str(directory.resolve())
    for line in maps:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(prefix) and ".safetensors" in fields[5]:
            start, end = (int(address, 16) for address in fields[0].split("-"))
            libc.madvise(start, end - start, MADV_PAGEOUT)  # EINVAL on older kernels: nothing happens


def _return_freed_memory() -> None:
    """Give the heap that quantising freed back to the OS (glibc keeps it otherwise: ~200 MB on
    SmolLM2 at 8 bits); a no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _load_quantized(
    source: Path | str, bits: int, dtype: torch.dtype, device: torch.device
) -> PreTrainedModel:
    """``from_pretrained`` with bitsandbytes quantisation, straight onto ``device``."""
    model = AutoModelForCausalLM.from_pretrained(
        source,
        dtype=dtype,
        quantization_config=quantization_config(bits, dtype),
        device_map={"": device},
    )
    prepared = prepare_quantized(model)
    if isinstance(source, Path) or Path(source).is_dir():
        _page_out(Path(source))
    return prepared


def load_causal_lm(
    name: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    cache_dir: Path | None = None,
    gguf_file: str | None = None,
    seed: int = 0,
    padding_side: PaddingSide | None = None,
    quantization: int | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer (see the module docstring for what ``name`` may be);
    ``quantization`` 4 or 8: bitsandbytes-quantised and frozen, a QLoRA base."""
    torch_device, torch_dtype = _placement(device, dtype)
    model: PreTrainedModel
    tiny = parse_tiny_name(name)
    if tiny is not None:
        if tiny.arch == "bert":
            raise ModelError(f"{name} is an encoder, not a causal LM: use load_encoder_classifier")
        model, tokenizer = _tiny(tiny, seed)
        if quantization is not None:
            # bitsandbytes quantises while loading: the random model goes through a checkpoint.
            with tempfile.TemporaryDirectory(prefix="fedtune-tiny-") as directory:
                model.save_pretrained(directory)
                model = _load_quantized(directory, quantization, torch_dtype, torch_device)
            # As the unquantised one: no (deleted) directory for a saved adapter to name as its base.
            model.config.name_or_path = model.name_or_path = ""
        return _finish(model, tokenizer, torch_device, torch_dtype, padding_side)
    source = _pretrained_source(name, "causal-lm", cache_dir, gguf_file, seed)
    if quantization is None:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    else:
        model = _load_quantized(source, quantization, torch_dtype, torch_device)
    tokenizer = AutoTokenizer.from_pretrained(source)
    return _finish(model, tokenizer, torch_device, torch_dtype, padding_side)


def load_tokenizer(
    name: str, *, cache_dir: Path | None = None, gguf_file: str | None = None
) -> PreTrainedTokenizerBase:
    """Only the tokenizer of ``name`` (with a pad token), for a party that must not load the model."""
    tiny = parse_tiny_name(name)
    if tiny is not None:
        tokenizer: PreTrainedTokenizerBase = tiny_tokenizer(tiny.tokenizer)
    else:
        # "encoder": any kind of model (a sequence classifier's party needs its tokenizer too).
        source = resolve_source(name, "encoder", cache_dir, gguf_file)
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except OSError as err:
            if isinstance(source, Path):
                raise
            raise _not_found(name, err) from err
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(
                f"the tokenizer of {name} has neither a pad nor an eos token to pad batches with"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_encoder_classifier(
    name: str,
    num_labels: int,
    *,
    dtype: str = "auto",
    device: str = "auto",
    cache_dir: Path | None = None,
    gguf_file: str | None = None,
    seed: int = 0,
    padding_side: PaddingSide | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A sequence classifier with a ``num_labels``-way head: freshly initialised from ``seed`` unless the
    checkpoint already holds a head of that width, which is kept.

    Encoders (``all-minilm-l6-v2``, ``tiny-bert``) and decoders (``smollm2-135m``, ``tiny-llama``: the
    head reads the last non-pad token); any model transformers can put a classification head on.
    """
    torch_device, torch_dtype = _placement(device, dtype)
    tiny = parse_tiny_name(name)
    if tiny is not None:
        if tiny.arch == "gpt2":
            raise ModelError(f"no tiny GPT-2 classifier: use tiny-bert, tiny-llama or tiny-qwen2, not {name}")
        model, tokenizer = _tiny(tiny, seed, num_labels=num_labels, classifier=True)
        return _finish(model, tokenizer, torch_device, torch_dtype, padding_side)
    source = _pretrained_source(name, "encoder", cache_dir, gguf_file, seed)
    # A checkpoint's own head of another width (e.g. a tiny-bert saved with 2 labels) is replaced.
    model = AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=num_labels, dtype=torch_dtype, ignore_mismatched_sizes=True
    )
    tokenizer = AutoTokenizer.from_pretrained(source)
    return _finish(model, tokenizer, torch_device, torch_dtype, padding_side)
