"""bertforge and transformers on the same weights: the real MiniLM, or a random model of a preset size."""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge import BertConfig, BertModel
from bertforge.checkpoint import default_model_dir


def load_pair(name: str, scratch: Path):
    """`minilm` is the default model; any other name is a preset, initialised at random and saved under scratch."""
    import transformers

    if name == "minilm":
        directory = default_model_dir()
    else:
        torch.manual_seed(0)
        directory = scratch / name
        config = transformers.BertConfig(**BertConfig.preset(name).to_dict())
        transformers.BertModel(config).save_pretrained(directory)
    reference = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
    return BertModel.from_pretrained(directory), reference
