"""A GGUF file served as it is quantised: its blocks are kept, never expanded to float32 on disk.

Once per file (weights.py caches the result under the cache root): the config and tokenizer that
transformers reads from the file are saved beside a copy of the tensors exactly as the file stores
them (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K ... blocks as bytes, F32/F16 as they are), with each
tensor's type and transformers' map from GGUF names to its parameter names. That copy is a
safetensors file, so later starts map it in milliseconds instead of parsing the GGUF's metadata.

At each load every tensor is dequantised once (gguf's own decoders), put through transformers'
tensor processor for the architecture (Llama's q/k rows un-permuted, Gemma's norms shifted,
stacked MoE experts split) and cast to the run dtype: the same weights transformers builds from
the file, without its per-start metadata parsing. A Q4 file's 4-bit groups survive this exactly,
so the runner's 4-bit copies (int4_weight.py) are rebuilt from them on a bf16 CPU.
"""

from __future__ import annotations

import json
import logging
import pathlib

import numpy as np
import torch

log = logging.getLogger(__name__)

TENSORS_FILE = "gguf_tensors.safetensors"
INDEX_FILE = "gguf_tensors.json"


def is_quantized_dir(model_dir: pathlib.Path) -> bool:
    return (pathlib.Path(model_dir) / INDEX_FILE).is_file()


def _processor(architecture: str, config: dict):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)


def convert(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Config, generation config and tokenizer (transformers' reading of the file), the raw tensors
    and their index into out_dir."""
    import gguf
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    from radixrt.runtime.model.models.registry import architecture_of

    kwargs = dict(gguf_file=gguf_path.name, local_files_only=True)
    config = AutoConfig.from_pretrained(str(gguf_path.parent), **kwargs)
    architecture_of(config.to_dict(), str(gguf_path))  # an unknown architecture stops here
    out_dir.mkdir(parents=True)
    config.save_pretrained(str(out_dir))
    GenerationConfig.from_model_config(config).save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs).save_pretrained(str(out_dir))
    reader = gguf.GGUFReader(str(gguf_path))
    architecture = str(reader.fields["general.architecture"].contents())
    with torch.device("meta"):  # only its parameter names are read
        hf_model = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(hf_model, _processor(architecture, config.to_dict()))
    tensors, index = {}, {}
    for t in reader.tensors:
        tensors[t.name] = torch.from_numpy(np.array(t.data))
        index[t.name] = t.tensor_type.name
    save_file(tensors, str(out_dir / TENSORS_FILE))
    (out_dir / INDEX_FILE).write_text(
        json.dumps({"architecture": architecture, "types": index, "names": names}, indent=1)
    )


def state_dict(model_dir: pathlib.Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's parameters (transformers' names) from a converted directory, in dtype."""
    import gguf
    from safetensors.torch import load_file

    model_dir = pathlib.Path(model_dir)
    index = json.loads((model_dir / INDEX_FILE).read_text())
    config = json.loads((model_dir / "config.json").read_text())
    processor = _processor(index["architecture"], config)
    names: dict[str, str] = index["names"]
    parsed: dict = {"tensors": {}, "config": config}
    for name, raw in load_file(str(model_dir / TENSORS_FILE)).items():
        qtype = gguf.GGMLQuantizationType[index["types"][name]]
        weights = gguf.quants.dequantize(raw.numpy(), qtype)
        result = processor.process(
            weights=weights, name=name, tensor_key_mapping=names, parsed_parameters=parsed
        )
        if result.name in names:
            parsed["tensors"][names[result.name]] = torch.from_numpy(np.copy(result.weights))
    # processors that assemble a parameter from several tensors (stacked experts) leave it here
    # in float32 as well: one cast for all
    return {k: v.to(dtype) for k, v in parsed["tensors"].items()}


def quantization_types(model_dir: pathlib.Path) -> dict[str, int]:
    """How many tensors of each GGUF type the converted file holds (for the start-up log)."""
    types = json.loads((pathlib.Path(model_dir) / INDEX_FILE).read_text())["types"]
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    return counts
