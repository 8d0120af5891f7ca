"""bertforge: BERT, complete and readable: tokenizer, encoder, checkpoints, training and inference."""

from bertforge.auto import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)
from bertforge.checkpoint.adapters import merge_lora
from bertforge.config import BertConfig
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, InputError
from bertforge.explain import Explanation, explain
from bertforge.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    ClassifierOutput,
    SpanOutput,
)
from bertforge.inference import (
    CrossEncoder,
    MultiVectorEncoder,
    SentenceEncoder,
    SparseEncoder,
    export_dynamic_quantized_onnx_model,
    extract_features,
    pipeline,
)
from bertforge.model import BertModel, EncoderOutput
from bertforge.pretraining import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForPreTraining,
    ElectraForPreTraining,
)
from bertforge.tasks.data import TextExample
from bertforge.tasks.finetune import FinetuneConfig
from bertforge.tasks.finetuned_model import FinetunedModel
from bertforge.tasks.fit import fit
from bertforge.tokenizer import BertTokenizer

__all__ = [
    "AutoConfig", "AutoModel", "AutoModelForMaskedLM", "AutoModelForMultipleChoice",
    "AutoModelForNextSentencePrediction", "AutoModelForPreTraining", "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification", "AutoModelForTokenClassification", "AutoTokenizer",
    "BertConfig", "BertForMaskedLM", "BertForMultipleChoice", "BertForNextSentencePrediction", "BertForPreTraining",
    "BertForQuestionAnswering", "BertForSequenceClassification", "BertForTokenClassification", "BertModel",
    "BertTokenizer", "BertforgeError", "CheckpointError", "ClassifierOutput", "ConfigError", "CrossEncoder",
    "ElectraForPreTraining", "EncoderOutput", "Explanation", "InputError", "MultiVectorEncoder",
    "SentenceEncoder", "SpanOutput",
    "SparseEncoder", "explain", "export_dynamic_quantized_onnx_model",
    "extract_features", "FinetuneConfig", "FinetunedModel", "TextExample", "fit", "merge_lora", "pipeline",
]
