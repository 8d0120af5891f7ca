"""BERT's WordPiece tokenizer: Vocab, BasicTokenizer, WordPiece and the BertTokenizer that combines them."""

from bertforge.tokenizer.basic import BasicTokenizer
from bertforge.tokenizer.learn_vocab import learn_vocab
from bertforge.tokenizer.tokenizer import BatchEncoding, BertTokenizer
from bertforge.tokenizer.vocab import Vocab
from bertforge.tokenizer.wordpiece import WordPiece

__all__ = ["BasicTokenizer", "BatchEncoding", "BertTokenizer", "Vocab", "WordPiece", "learn_vocab"]
