"""bertforge: BERT, complete and readable: tokenizer, encoder, checkpoints, training and inference."""

from bertforge.config import BertConfig
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, InputError
from bertforge.model import BertModel, EncoderOutput

__all__ = [
    "BertConfig", "BertModel", "BertforgeError", "CheckpointError", "ConfigError",
    "EncoderOutput", "InputError",
]
