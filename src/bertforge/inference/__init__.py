from bertforge.inference.features import LAYER_COMBINATIONS, POOLINGS, extract_features, pool, token_features

__all__ = ["LAYER_COMBINATIONS", "POOLINGS", "extract_features", "pool", "token_features"]
