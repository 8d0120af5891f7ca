from bertforge.compress.quantize import (
    METHODS,
    QuantizationConfig,
    QuantizedLinear,
    auto_precision,
    quantize,
    save_quantized,
)

__all__ = ["METHODS", "QuantizationConfig", "QuantizedLinear", "auto_precision", "quantize", "save_quantized"]
