"""Pre-training: masking strategies, the pre-training heads and models, and the objectives that combine them."""

from bertforge.pretraining.collate import PretrainingCollator
from bertforge.pretraining.corpus import CorpusReader, CorpusSummary, Document, prepare_corpus
from bertforge.pretraining.heads import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForPreTraining,
    ElectraForPreTraining,
    ElectraOutput,
    MaskedLMHead,
    MaskedLMOutput,
    NextSentenceHead,
    PreTrainingOutput,
    ReplacedTokenHead,
    electra_generator_config,
)
from bertforge.pretraining.instances import SENTENCE_PAIRS, Instance, InstanceStream
from bertforge.pretraining.masking import MASKING_STRATEGIES, MaskedBatch, Masker, mask_tokens
from bertforge.pretraining.objectives import OBJECTIVES, Objective, get_objective

__all__ = [
    "MASKING_STRATEGIES", "OBJECTIVES", "SENTENCE_PAIRS", "BertForMaskedLM", "BertForNextSentencePrediction",
    "BertForPreTraining", "CorpusReader", "CorpusSummary", "Document", "ElectraForPreTraining", "ElectraOutput",
    "Instance", "InstanceStream", "MaskedBatch", "MaskedLMHead", "MaskedLMOutput", "Masker", "NextSentenceHead",
    "Objective", "PreTrainingOutput", "PretrainingCollator", "ReplacedTokenHead", "electra_generator_config",
    "get_objective", "mask_tokens", "prepare_corpus",
]
