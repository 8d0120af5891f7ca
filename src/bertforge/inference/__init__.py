from bertforge.inference.cross_encoder import CrossEncoder
from bertforge.inference.features import (
    LAYER_COMBINATIONS,
    POOLINGS,
    TOKEN_LEVELS,
    ScalarMix,
    TokenVectors,
    extract_features,
    extract_token_features,
    pool,
    token_features,
)
from bertforge.inference.optimize import PRECISIONS, InferenceOptions
from bertforge.inference.pipelines import pipeline
from bertforge.inference.sentence_encoder import SentenceEncoder

__all__ = [
    "LAYER_COMBINATIONS", "POOLINGS", "PRECISIONS", "TOKEN_LEVELS", "InferenceOptions", "ScalarMix", "SentenceEncoder",
    "CrossEncoder", "TokenVectors",
    "extract_features", "extract_token_features", "pipeline", "pool", "token_features",
]

# onnx.py, serve.py and attention_view.py are imported from their modules: they need optional packages
# (onnx, onnxruntime; fastapi, uvicorn) that plain inference does not.
