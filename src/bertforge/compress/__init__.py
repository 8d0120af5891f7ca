from bertforge.compress.int8_linear import QuantizedLinear
from bertforge.compress.quantize import METHODS, QuantizationConfig, auto_precision, quantize, save_quantized

__all__ = ["METHODS", "QuantizationConfig", "QuantizedLinear", "auto_precision", "quantize", "save_quantized"]
