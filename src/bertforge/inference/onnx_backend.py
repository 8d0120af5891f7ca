"""sentence-transformers' `backend="onnx"`: a SentenceEncoder's, CrossEncoder's, SparseEncoder's or
MultiVectorEncoder's model whose forward ONNX Runtime runs, from the ONNX file of its folder (onnx/model.onnx, where
sentence-transformers saves one; `file_name` picks another) or, when there is none, from bertforge's own export of
its weights. The torch model stays beside the session: its configuration, its sentence-transformers layout and its
weights for saving (with the ONNX file) come from it."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.errors import ConfigError, InputError
from bertforge.heads import ClassifierOutput
from bertforge.model import EncoderOutput

ONNX_FILE = "onnx/model.onnx"  # sentence-transformers' place for it in a model folder
BACKENDS = ("torch", "onnx")
# sentence-transformers' model_kwargs for the ONNX backend (the rest are the torch model's from_pretrained's)
ONNX_OPTIONS = ("file_name", "provider", "export")


class OnnxRuntimeModel(nn.Module):
    """A bertforge model whose forward an ONNX Runtime session runs, read where bertforge reads the model's own
    output: an encoder's `last_hidden_state`, a classifier's or a masked LM's `logits`. Everything else (the
    configuration, the layout, the number of labels, the weights saved) is the torch model's. Inference only."""

    def __init__(self, model: nn.Module, onnx_model: bytes, provider: str = "CPUExecutionProvider"):
        super().__init__()
        self.torch_model, self.onnx_model, self.provider = model, onnx_model, provider
        self.session = inference_session(onnx_model, provider)
        self.input_names = {given.name for given in self.session.get_inputs()}
        outputs = [given.name for given in self.session.get_outputs()]
        wanted = "logits" if hasattr(model, "bert") else "last_hidden_state"  # a task model's, or an encoder's
        self.output_name = wanted if wanted in outputs else outputs[0]

    # A copy for another process (a multi-process pool) or a deepcopy: the session, which does not pickle, is made
    # again from the ONNX bytes there.
    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "session"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.session = inference_session(self.onnx_model, self.provider)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "torch_model" or "torch_model" not in self._modules:
                raise
            return getattr(self._modules["torch_model"], name)  # num_labels, sentence_dense, ...

    # what the encoders read and change on their model: the torch model's own
    config = property(lambda self: self.torch_model.config,
                      lambda self, value: setattr(self.torch_model, "config", value))
    sentence_embedding = property(lambda self: getattr(self.torch_model, "sentence_embedding", None),
                                  lambda self, value: setattr(self.torch_model, "sentence_embedding", value))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, first_token_only: bool = False,
                output_hidden_states: bool = False, **unused: Any) -> EncoderOutput | ClassifierOutput:
        if output_hidden_states:
            raise ConfigError("backend 'onnx' gives the model's output alone; other layer recipes need backend "
                              "'torch'")
        if self.training and torch.is_grad_enabled():
            raise ConfigError("backend 'onnx' runs ONNX Runtime, which does not train; load the model with "
                              "backend 'torch' to train it")
        given = {"input_ids": input_ids,
                 "attention_mask": torch.ones_like(input_ids) if attention_mask is None else attention_mask,
                 "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids}
        feeds = {name: tensor.cpu().numpy().astype(np.int64) for name, tensor in given.items()
                 if name in self.input_names}
        values = torch.from_numpy(self.session.run([self.output_name], feeds)[0]).to(input_ids.device)
        if self.output_name == "logits":
            return ClassifierOutput(logits=values)
        return EncoderOutput(last_hidden_state=values[:, :1] if first_token_only else values, pooler_output=None)

    def save_pretrained(self, path: str | Path, **options: Any) -> None:
        """The torch model's folder (its weights and layout) with the ONNX file where sentence-transformers puts it."""
        self.torch_model.save_pretrained(path, **options)
        target = Path(path) / ONNX_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.onnx_model)


def split_model_kwargs(backend: str, model_kwargs: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """sentence-transformers' model_kwargs as (the torch model's from_pretrained options, the ONNX backend's)."""
    torch_options = dict(model_kwargs or {})
    if backend != "onnx":
        return torch_options, {}
    return torch_options, {name: torch_options.pop(name) for name in ONNX_OPTIONS if name in torch_options}


def inference_session(onnx_model: bytes, provider: str):
    """ONNX Runtime's session of a model's bytes on `provider`; a provider this installation lacks is one line."""
    from bertforge.inference.onnx import require

    runtime = require("onnxruntime")
    if provider not in runtime.get_available_providers():
        raise ConfigError(f"provider {provider!r} is not in this ONNX Runtime; it has "
                          f"{', '.join(runtime.get_available_providers())}")
    return runtime.InferenceSession(onnx_model, providers=[provider])


def onnx_runtime_model(model: nn.Module, tokenizer, folder: Path | None, file_name: str = ONNX_FILE,
                       provider: str = "CPUExecutionProvider", export: bool | None = None) -> OnnxRuntimeModel:
    """The ONNX backend of a loaded model: `folder`'s `file_name`, else (or with export=True) the model exported
    here, checked against its torch forward (sentence-transformers exports too, and tells to save it)."""
    from bertforge.inference.onnx import export_onnx, task_of

    path = None if folder is None else folder / file_name
    if export is not True and path is not None and path.is_file():
        return OnnxRuntimeModel(model, path.read_bytes(), provider)
    if export is False:
        raise ConfigError(f"{path or file_name}: no ONNX file, and export=False asks not to export one")
    with tempfile.TemporaryDirectory() as scratch:
        exported = Path(scratch) / "model.onnx"
        export_onnx(model, tokenizer, exported, task=task_of(model))
        return OnnxRuntimeModel(model, exported.read_bytes(), provider)


@dataclass(frozen=True)
class DynamicQuantization:
    """One of sentence-transformers' named int8 configurations for ONNX Runtime's dynamic quantization (optimum's
    AutoQuantizationConfig as sentence-transformers calls it): weights of `weight_type` with one scale per output
    channel, symmetric; activations uint8, their range found per call."""

    weight_type: str  # ONNX Runtime's QuantType name: the kernels of that CPU family multiply these fastest

    @property
    def suffix(self) -> str:
        return self.weight_type.lower()


# sentence-transformers' names, by the CPU family they are for; the file of each is onnx/model_<type>_<name>.onnx
DYNAMIC_QUANTIZATIONS = {
    "arm64": DynamicQuantization("QInt8"),
    "avx2": DynamicQuantization("QUInt8"),  # u8 x u8: AVX2's integer products without VNNI saturate s8 weights
    "avx512": DynamicQuantization("QInt8"),
    "avx512_vnni": DynamicQuantization("QInt8"),
}


def export_dynamic_quantized_onnx_model(model: nn.Module, quantization_config: str, model_name_or_path: str | Path,
                                        push_to_hub: bool = False, create_pr: bool = False,
                                        file_suffix: str | None = None) -> Path:
    """sentence-transformers' function of that name: the ONNX model of an encoder loaded with backend="onnx"
    (SentenceEncoder, CrossEncoder, SparseEncoder or MultiVectorEncoder) quantized to int8 by ONNX Runtime,
    written to the folder `model_name_or_path` as onnx/model_<suffix>.onnx (suffix: qint8_avx512_vnni,
    quint8_avx2, ...), which `model_kwargs={"file_name": ...}` then loads. Returns the file's path."""
    from bertforge.atomic import atomic_path
    from bertforge.errors import check_choice
    from bertforge.inference.onnx import require
    from bertforge.validation import check_paths

    runtime_model = getattr(model, "model", None)
    if not isinstance(runtime_model, OnnxRuntimeModel):
        raise ConfigError(f"export_dynamic_quantized_onnx_model quantizes an encoder loaded with backend='onnx'; "
                          f"this {type(model).__name__} runs {getattr(model, 'backend', 'torch')!r}")
    if push_to_hub or create_pr:
        raise ConfigError("push_to_hub: bertforge writes to a local folder only (nothing is sent to a hub)")
    if not isinstance(quantization_config, str):
        raise ConfigError(f"quantization_config must be the name of a configuration, one of "
                          f"{', '.join(DYNAMIC_QUANTIZATIONS)}; got a {type(quantization_config).__name__}")
    check_choice(quantization_config, DYNAMIC_QUANTIZATIONS, "quantization_config")
    if not isinstance(model_name_or_path, str | os.PathLike):
        raise ConfigError(f"model_name_or_path must be the folder to write the quantized model into, got "
                          f"{model_name_or_path!r:.60}")
    check_paths(model_name_or_path=model_name_or_path)
    # the suffix is part of one file name, onnx/model_<suffix>.onnx: a separator would write elsewhere
    if file_suffix is not None and (not isinstance(file_suffix, str) or not file_suffix.strip()
                                    or any(character in file_suffix for character in "/\\\0")):
        raise ConfigError(f"file_suffix must be a plain name for onnx/model_<file_suffix>.onnx (no folders), got "
                          f"{file_suffix!r:.60}")
    chosen = DYNAMIC_QUANTIZATIONS[quantization_config]
    quantization = require("onnxruntime.quantization")
    suffix = file_suffix or f"{chosen.suffix}_{quantization_config}"
    target = Path(model_name_or_path) / Path(ONNX_FILE).parent / f"model_{suffix}.onnx"
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "model.onnx"
        source.write_bytes(runtime_model.onnx_model)
        try:
            with atomic_path(target) as temporary:
                quantization.quantize_dynamic(source, temporary, weight_type=getattr(quantization.QuantType,
                                                                                     chosen.weight_type),
                                              per_channel=True, extra_options={"WeightSymmetric": True})
        except OSError as error:  # a file where a folder should be, a folder not writable, a full disk
            raise InputError(f"can't write the quantized ONNX model: {error.strerror or error}", target) from None
    return target
