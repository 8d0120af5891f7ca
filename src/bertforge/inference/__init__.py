from bertforge.inference.cross_encoder import CrossEncoder
from bertforge.inference.embedding_precision import quantize_embeddings
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
from bertforge.inference.hard_negatives import mine_hard_negatives
from bertforge.inference.multi_vector_encoder import MultiVectorEncoder, maxsim, maxsim_pairwise
from bertforge.inference.onnx_backend import export_dynamic_quantized_onnx_model
from bertforge.inference.optimize import PRECISIONS, InferenceOptions
from bertforge.inference.pipelines import pipeline
from bertforge.inference.sentence_encoder import SentenceEncoder
from bertforge.inference.similarity import (
    SIMILARITIES,
    community_detection,
    paraphrase_mining,
    paraphrase_mining_embeddings,
    semantic_search,
)
from bertforge.inference.sparse_encoder import SPLADE_ACTIVATIONS, SPLADE_STRATEGIES, SparseEncoder
from bertforge.inference.token_pooling import HierarchicalTokenPooling

__all__ = [
    "LAYER_COMBINATIONS", "POOLINGS", "PRECISIONS", "SIMILARITIES", "SPLADE_ACTIVATIONS", "SPLADE_STRATEGIES",
    "TOKEN_LEVELS", "CrossEncoder", "HierarchicalTokenPooling", "InferenceOptions", "MultiVectorEncoder", "ScalarMix",
    "SentenceEncoder", "SparseEncoder", "TokenVectors", "community_detection", "export_dynamic_quantized_onnx_model",
    "extract_features", "extract_token_features", "maxsim", "maxsim_pairwise", "mine_hard_negatives",
    "paraphrase_mining", "paraphrase_mining_embeddings", "pipeline", "pool", "quantize_embeddings", "semantic_search",
    "token_features",
]

# onnx.py and serve/ are imported from their modules: they need optional packages (onnx, onnxruntime; fastapi,
# uvicorn) that plain inference does not.
