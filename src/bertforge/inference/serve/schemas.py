"""The request and response bodies of every route, as pydantic models: FastAPI validates requests with them and
publishes them in the OpenAPI document (/openapi.json, /docs)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from bertforge.explain.methods import DEFAULT_STEPS, MAX_STEPS, METHODS
from bertforge.explain.targets import BASELINES
from bertforge.inference.features import POOLINGS

Pooling = Literal[tuple(POOLINGS)]
ExplainMethod = Literal[tuple(METHODS)]
ExplainBaseline = Literal[tuple(BASELINES)]


def unicode_text(value: str) -> str:
    """JSON's escapes can spell half of a UTF-16 pair ("\\ud800"), which is no Unicode text: refused, rather than
    tokenized as nothing."""
    lone = next((char for char in value if "\ud800" <= char <= "\udfff"), None)
    if lone is not None:
        raise ValueError(f"holds an unpaired surrogate (U+{ord(lone):04X}), which is not Unicode text")
    return value


Text = Annotated[str, AfterValidator(unicode_text)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The model a request names, which clients of servers of several models send (vLLM's, Infinity's)
MODEL = "ignored: the server has one model"
TRUNCATE_PROMPT_TOKENS = ("vLLM's field: each model input cut to its first N tokens ([CLS] and [SEP] included; a "
                          "pair's longer text first); -1: the model's length")
TruncationSide = Literal["left", "right"]
TRUNCATION_SIDE = "vLLM's field: where a long input is cut: right keeps its first tokens, left its last ones"
CACHE_SALT = "vLLM's prefix cache's salt: ignored (no cache)"


class ErrorResponse(BaseModel):
    error: str = Field(description="what was wrong, in one line")
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"] = Field(
        description="text-embeddings-inference's kind of error: Empty for an empty input, Overloaded when busy, "
                    "Backend when the model can't do it or failed, Validation for the rest")


class OpenAIErrorDetail(BaseModel):
    message: str = Field(description="what was wrong, in one line")
    type: str = Field(description="invalid_request_error, authentication_error or server_error")
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    """OpenAI's error shape, which its clients read (the routes under /v1/ and /v2/)."""
    error: OpenAIErrorDetail


# --- requests -----------------------------------------------------------------------------------------------------

Texts = Annotated[list[Text], Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(strict=True)]], Field(min_length=1)]  # true is no token id
TRUNCATE = ("text-embeddings-inference's field: cut texts longer than the limit (true) or answer 413 (false); "
            "default: the server's --long-text")


TokenIdLists = Annotated[list[TokenIds], Field(min_length=1)]
# text-embeddings-inference's fields, under its names (its clients send them: huggingface_hub's InferenceClient,
# LangChain's and LlamaIndex's TEI embeddings)
TruncationDirection = Literal["right", "left", "Right", "Left"]
TRUNCATION_DIRECTION = "text-embeddings-inference's field: the end of a long text that truncate cuts"
PROMPT_NAME = ("text-embeddings-inference's field: the model's sentence-transformers prompt of this name goes before "
               "each text (default: its default_prompt_name, if any)")
TEI_INPUTS = "text-embeddings-inference's field: a text, a list of texts, or token ids (one list, or a list of lists)"


class InferenceAPIOptions(Strict):
    """The Hugging Face Inference API's "options", which its clients still send beside "inputs" (LangChain's
    HuggingFaceInferenceAPIEmbeddings, Weaviate's text2vec-huggingface). They steer the hosted service's cache,
    cold starts and GPUs; a server that holds its model and keeps no cache has none of these, so they change
    nothing here."""
    use_cache: bool | None = Field(None, strict=True, description="the hosted API's answer cache: none here")
    wait_for_model: bool | None = Field(None, strict=True, description="wait for a cold model: this one is loaded")
    use_gpu: bool | None = Field(None, strict=True, description="the hosted API's GPU: the server's device is fixed")


OPTIONS = "the Hugging Face Inference API's options, accepted for its clients; they change nothing here"


class FeatureExtractionParameters(Strict):
    """The Hugging Face feature-extraction task's parameters, where its older clients put them (LangChain's
    HuggingFaceHubEmbeddings sends {"inputs": texts, "parameters": model_kwargs}, {} by default): the same as the
    request's own fields of those names, given in one place or the other."""
    normalize: bool | None = Field(None, strict=True)
    truncate: bool | None = Field(None, strict=True, description=TRUNCATE)
    truncation_direction: TruncationDirection | None = Field(None, description=TRUNCATION_DIRECTION)
    prompt_name: str | None = Field(None, description=PROMPT_NAME)


class EmbedRequest(Strict):
    model: str | None = Field(None, description=MODEL)
    texts: list[Text] | None = Field(None, min_length=1, description="the texts to embed (at most max_texts)")
    inputs: Text | Texts | TokenIds | TokenIdLists | None = Field(
        None, description=TEI_INPUTS + "; the answer is then a bare list of vectors")
    pooling: Pooling | None = Field(None, description="how token vectors become one (default: the checkpoint's "
                                                      "sentence-transformers pooling, else mean)")
    normalize: bool | None = Field(None, strict=True, description="scale each vector to unit length (default: "
                                   "as the checkpoint's sentence-transformers modules say, else no)")
    truncate: bool | None = Field(None, strict=True, description=TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=TRUNCATION_DIRECTION)
    dimensions: int | None = Field(None, ge=1, strict=True, description="text-embeddings-inference's field: keep "
                                   "the first N dimensions (re-normalized when the vectors are)")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="with texts: each vector as floats, or as base64 of its little-endian float32 values; "
                             "with inputs, floats whatever it says, as text-embeddings-inference answers "
                             "(huggingface_hub's InferenceClient.feature_extraction sends it, and reads floats)")
    prompt_name: str | None = Field(None, description=PROMPT_NAME)
    parameters: FeatureExtractionParameters | None = Field(None, description="the feature-extraction task's "
                                                           "parameters: these fields, given here instead")
    options: InferenceAPIOptions | None = Field(None, description=OPTIONS)


class EmbedAllRequest(Strict):
    model: str | None = Field(None, description=MODEL)
    inputs: Text | Texts | TokenIds | TokenIdLists = Field(description=TEI_INPUTS)
    truncate: bool | None = Field(None, strict=True, description=TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=TRUNCATION_DIRECTION)
    prompt_name: str | None = Field(None, description=PROMPT_NAME)


class EmbedSparseRequest(EmbedAllRequest):
    """text-embeddings-inference's /embed_sparse request (the same fields as /embed_all's)."""


class SparseValue(BaseModel):
    index: int = Field(description="the vocabulary id (word piece) the weight is for")
    value: float


class SimilarityInput(Strict):
    source_sentence: Text
    sentences: Texts = Field(description="the texts compared with source_sentence")


class SimilarityParameters(Strict):
    truncate: bool | None = Field(None, strict=True, description=TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=TRUNCATION_DIRECTION)
    prompt_name: str | None = Field(None, description=PROMPT_NAME)


class SimilarityRequest(Strict):
    """text-embeddings-inference's (and the Hugging Face sentence-similarity task's) request."""
    model: str | None = Field(None, description=MODEL)
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    options: InferenceAPIOptions | None = Field(None, description=OPTIONS)


Role = Literal["query", "document"]
INPUT_TYPE = ("a multi-vector (ColBERT) model encodes queries and documents differently (a query's [MASK]s, a "
              "document's skiplist); a dense model puts its sentence-transformers prompt of this name, if it has "
              "one, before each text")


class HostedEmbeddingRequest(BaseModel):
    """What OpenAI's and Jina's embedding requests share (extra fields are ignored, as those services ignore
    them)."""
    input: Text | Texts | TokenIds | TokenIdLists = Field(
        description="a text, a list of texts, or token ids of the model's vocabulary (one list, or a list of "
                    "lists), each a whole input from [CLS] to [SEP], read as they are")
    model: str | None = Field(None, description="ignored: the server has one model (see /v1/models)")


class VLLMEncoding(BaseModel):
    """vLLM's base64 vectors: the numbers they hold and their byte order (float encoding is unaffected)."""
    embed_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="vLLM's: the numbers base64 holds (float encoding is unaffected)")
    endianness: Literal["native", "little", "big"] = Field(
        "native", description="vLLM's: their byte order in base64 (native: the server's)")


class OpenAIEmbeddingRequest(HostedEmbeddingRequest, VLLMEncoding):
    dimensions: int | None = Field(None, ge=0, strict=True, description="keep the first N dimensions "
                                                                         "(re-normalized); 0, Infinity's client's "
                                                                         "default: all")
    encoding_format: Literal["float", "base64"] | None = Field(
        None, description="float (default; null too, as OpenAI reads it: litellm sends null) or base64")
    user: str | None = None
    input_type: Role | None = Field(None, description=INPUT_TYPE)
    is_query: bool | None = Field(None, strict=True, description="PyLate's server's field: true (its default) as "
                                                                  "input_type query, false as document")
    task: Literal["retrieval.query", "retrieval.passage", "text-matching", "classification", "separation"] | None = \
        Field(None, description="Jina's: the model's prompt of that name, else for retrieval.query and "
                                "retrieval.passage a query's or a document's prompt")
    embedding_type: Literal["float", "base64", "binary", "ubinary"] | None = Field(
        None, description="Jina's encoding_format, with its binary and ubinary (sign bits, eight to a byte)")
    encoding_type: Literal["float", "base64", "binary", "ubinary"] | None = Field(
        None, description="embedding_type's older name, which Jina's API still takes (LlamaIndex's JinaEmbedding "
                          "sends it)")
    normalized: bool | None = Field(None, strict=True, description="Jina's: false gives the vectors as pooled, not "
                                                                    "scaled to unit length (default: unit length)")
    truncate: bool | None = Field(None, strict=True, description="Jina's: cut a text over the model's length (true) "
                                                                  "or answer 413 (false); default: --long-text")
    late_chunking: bool | None = Field(None, strict=True, description="Jina's: refused when true")
    normalize: bool | None = Field(None, strict=True, description="vLLM's older name for normalized")
    use_activation: bool | None = Field(None, strict=True, description="vLLM's name for normalized")
    truncate_prompt_tokens: int | None = Field(None, ge=-1, strict=True, description=TRUNCATE_PROMPT_TOKENS)
    truncation_side: TruncationSide = Field("right", description=TRUNCATION_SIDE)
    cache_salt: str | None = Field(None, description=CACHE_SALT)
    add_special_tokens: bool = Field(True, strict=True, description="vLLM's: false reads a text's word pieces "
                                                                    "without [CLS] and [SEP]")


class VectorsConfig(BaseModel):
    """What Weaviate's text2vec-transformers module sends with each text (extra fields ignored)."""
    pooling_strategy: Literal["masked_mean", "cls", ""] | None = Field(
        None, description="a checkpoint without a sentence-transformers layout: masked_mean (the default) or cls; "
                          "one with a layout pools as it says, as the module's sentence-transformers image does")
    task_type: str | None = Field(None, description="query: a query's prompt; anything else (passage): a "
                                                    "document's")
    dimensions: int | None = Field(None, ge=1, strict=True, description="keep the first N dimensions "
                                                                        "(re-normalized)")


class VectorsRequest(BaseModel):
    """Weaviate's text2vec-transformers inference API: one text, or a batch of texts (the module's newer batch
    format). The module sends its answer's fields (dims, vector, error) empty; they are ignored."""
    text: Text | None = Field(None, description="one text: the answer is {text, vector, dim, dims}")
    texts: Texts | None = Field(None, description="a batch of texts: the answer is {vectors, dims}")
    config: VectorsConfig | None = None


class VectorResponse(BaseModel):
    text: str
    vector: list[float] = Field(description="unit length")
    dim: int = Field(description="the vector's dimensions (text2vec-transformers' name)")
    dims: int = Field(description="the same, under the name Weaviate's module reads")


class VectorsResponse(BaseModel):
    vectors: list[list[float]]
    dims: int


class MultiVectorRequest(HostedEmbeddingRequest):
    """Jina's multi-vector request (its /v1/multi-vector), for a multi-vector (ColBERT) model."""
    input_type: Role = Field("document", description=INPUT_TYPE)
    dimensions: int | None = Field(None, ge=1, strict=True, description="keep the first N dimensions of each "
                                                                        "token vector (re-normalized)")
    encoding_format: Literal["float", "base64"] | None = None
    embedding_type: Literal["float", "base64"] | None = Field(None, description="encoding_format's other name")


class Question(Strict):
    id: str | None = Field(None, description="returned with its answer (default: the question's place, from 1)")
    question: Text
    context: Text = Field(description="the text the answer is a span of; a long one is split into windows")


TextOrPair = Annotated[list[Text], Field(min_length=1, max_length=2)]


class TextAndPair(Strict):
    """transformers' text-classification pipeline's input of a pair."""
    text: Text
    text_pair: Text | None = None


class TextClassificationParameters(Strict):
    """The Hugging Face text-classification task's parameters (huggingface_hub's InferenceClient sends them)."""
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        None, description="what turns the logits into scores (default: the model's, softmax or sigmoid)")
    top_k: int | None = Field(None, ge=1, strict=True, description="keep the k highest scores")


# The Hugging Face Inference API's tasks that huggingface_hub's InferenceClient sends to POST /, answered as
# transformers' pipelines answer them (inference/pipelines.py).

class TokenClassificationParameters(Strict):
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] | None = Field(
        None, description="every word piece (none, the default), or entities of pieces (simple) or of whole words")
    ignore_labels: list[str] | None = Field(None, description="labels left out of the answer (default: O)")
    stride: int | None = Field(None, ge=0, strict=True, description=(
        "tag every window of the server's max_length tokens of a long text, consecutive windows sharing this many "
        "word pieces, and join their entities (needs an aggregation_strategy other than none); null: the text is "
        "cut at max_length"))


class TokenClassificationRequest(Strict):
    inputs: Text | Texts = Field(description="a text, or a list of texts (then a list of answers)")
    parameters: TokenClassificationParameters | None = None
    options: InferenceAPIOptions | None = Field(None, description=OPTIONS)


class QuestionContext(Strict):
    question: Text
    context: Text


class QuestionAnsweringParameters(Strict):
    top_k: int | None = Field(None, ge=1, strict=True, description="the k best answers, in a list when k > 1")
    doc_stride: int | None = Field(None, ge=0, strict=True, description="tokens two windows of a long context "
                                                                        "share")
    max_answer_len: int | None = Field(None, ge=1, strict=True, description="tokens in an answer, at most")
    max_seq_len: int | None = Field(None, ge=1, strict=True, description="tokens in a window, question included "
                                                                         "(at most the server's max_length)")
    max_question_len: int | None = Field(None, ge=1, strict=True)
    handle_impossible_answer: bool | None = Field(None, strict=True, description="let \"no answer\" (\"\" at 0, "
                                                                                 "0) win")
    align_to_words: bool | None = Field(None, strict=True, description="stretch answers to whole words")


class QuestionAnsweringRequest(Strict):
    inputs: QuestionContext | Annotated[list[QuestionContext], Field(min_length=1)]
    parameters: QuestionAnsweringParameters | None = None
    options: InferenceAPIOptions | None = Field(None, description=OPTIONS)


class ZeroShotParameters(Strict):
    candidate_labels: Text | Texts = Field(description="the labels (or one text of them separated by commas)")
    multi_label: bool | None = Field(None, strict=True, description="score each label alone (entailment against "
                                                                    "contradiction) rather than against the others")
    hypothesis_template: str | None = Field(None, description="the sentence a label is put in, at {} (default: "
                                                              "\"This example is {}.\")")


class ZeroShotRequest(Strict):
    """Zero-shot classification by a natural-language-inference classifier (an entailment label among its labels)."""
    inputs: Text | Texts
    parameters: ZeroShotParameters
    options: InferenceAPIOptions | None = Field(None, description=OPTIONS)


class PredictRequest(Strict):
    model: str | None = Field(None, description=MODEL)
    texts: list[Text] | None = Field(None, min_length=1, description="the texts (at most max_texts), for a "
                                                                    "classifier, regression model or tagger")
    text_pairs: list[Text] | None = Field(None, description="a second text per text, for pair tasks")
    questions: list[Question] | None = Field(None, min_length=1, description="for a question-answering model, "
                                                                             "instead of texts")
    inputs: Text | TextOrPair | Annotated[list[TextOrPair], Field(min_length=1)] | Annotated[
        list[Text], Field(min_length=3)] | TextAndPair | Annotated[list[TextAndPair], Field(min_length=1)] | None = \
        Field(None, description="text-embeddings-inference's field, for a sequence classifier: a text, a pair [text, "
                                "text], a batch of [text] and [text, text], or of three texts or more (no pair); "
                                "also transformers' pipeline's {text, text_pair} or a list of them; the answer is "
                                "then its list of {score, label} per input, highest first (a bare list for a single "
                                "input)")
    raw_scores: bool = Field(False, strict=True, description="with inputs: the logits rather than probabilities")
    truncate: bool | None = Field(None, strict=True, description=TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=TRUNCATION_DIRECTION)
    parameters: TextClassificationParameters | None = None
    options: InferenceAPIOptions | None = Field(None, description=OPTIONS)


class VLLMFields(BaseModel):
    """The fields vLLM's pooling requests share, which its clients send to every route (extra fields are refused
    by name on bertforge's own routes, so these are named)."""
    model: str | None = Field(None, description=MODEL)
    user: str | None = Field(None, description="ignored")
    request_id: str | None = Field(None, description="vLLM's: ignored (each answer has an id of its own)")
    priority: int | None = Field(None, strict=True, description="ignored (one queue)")
    truncate_prompt_tokens: int | None = Field(None, ge=-1, strict=True, description=TRUNCATE_PROMPT_TOKENS)
    truncation_side: TruncationSide = Field("right", description=TRUNCATION_SIDE)
    cache_salt: str | None = Field(None, description=CACHE_SALT)


class VLLMActivation(BaseModel):
    """vLLM's switch between a classifier's probabilities and its logits, under its current name and its two
    older ones."""
    use_activation: bool | None = Field(None, strict=True, description="vLLM's: false gives logits (raw scores)")
    activation: bool | None = Field(None, strict=True, description="vLLM's older name for use_activation")
    softmax: bool | None = Field(None, strict=True, description="vLLM's older name for use_activation")

    @property
    def raw(self) -> bool:
        return False in (self.use_activation, self.activation, self.softmax)


class VLLMScoring(VLLMFields, VLLMActivation):
    """What vLLM's rerank and score requests share: its fields, and each side cut to its first word pieces."""
    max_tokens_per_query: int | None = Field(None, ge=0, strict=True, description="vLLM's: the query (score's first "
                                             "texts) cut to its first N word pieces (0: not cut)")
    max_tokens_per_doc: int | None = Field(None, ge=0, strict=True, description="each document (score's second "
                                           "texts) cut to its first N word pieces (0: not cut)")


class RerankRequest(Strict):
    model: str | None = Field(None, description=MODEL)
    query: Text
    texts: list[Text] = Field(min_length=1, description="the texts to rank against the query (at most max_texts)")
    raw_scores: bool = Field(False, strict=True, description="a pair classifier's logit instead of its probability")
    return_text: bool = Field(False, strict=True)
    top_n: int | None = Field(None, ge=1, strict=True, description="the N most relevant only (default: all; "
                                                                  "Elasticsearch's Hugging Face rerank sends it)")
    truncate: bool | None = Field(None, strict=True, description=TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=TRUNCATION_DIRECTION)


class CohereRerankRequest(VLLMScoring, Strict):
    """Cohere's rerank API, v1 and v2 (Jina's and vLLM's rerank routes take the same fields, and vLLM's own)."""
    query: Text
    documents: Annotated[list[Text | Annotated[dict[str, Text], Field(min_length=1)]], Field(min_length=1)] = Field(
        description='texts, or objects read by their "text" field or by rank_fields (at most max_texts)')
    top_n: int | None = Field(None, ge=0, strict=True, description="the N most relevant only (default, and 0 as "
                                                                  "vLLM says: all)")
    return_documents: bool | None = Field(None, strict=True, description="each result with its document, as sent "
                                          "(default, as vLLM and Jina answer; false: none)")
    raw_scores: bool = Field(False, strict=True, description="Infinity's field: a pair classifier's logit instead "
                                                             "of its probability")
    rank_fields: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description='v1, for object documents: the fields read, in order, as "field: value" lines')


class ScoreRequest(VLLMScoring, Strict):
    """vLLM's score API: the first texts against the second, one against each (1:N) or pair by pair (N:N), under
    any of its field names."""
    text_1: Text | Texts | None = None
    text_2: Text | Texts | None = None
    queries: Text | Texts | None = Field(None, description="text_1's other name")
    documents: Text | Texts | None = Field(None, description="text_2's other name")
    items: Text | Texts | None = Field(None, description="text_2's other name")
    data_1: Text | Texts | None = Field(None, description="text_1's other name")
    data_2: Text | Texts | None = Field(None, description="text_2's other name")


class PoolingRequest(VLLMFields, VLLMActivation, VLLMEncoding, Strict):
    """vLLM's pooling API: a task's raw output per input."""
    input: Text | Texts | TokenIds | TokenIdLists = Field(description="texts, or token ids as /v1/embeddings "
                                                                     "takes them")
    task: Literal["embed", "token_embed", "classify"] | None = Field(
        None, description="embed: a vector per input, as /v1/embeddings; token_embed: every token's vector; "
                          "classify: every label's probability, as /classify (default: the model's: an encoder "
                          "embeds, a sequence classifier classifies)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=0, strict=True, description="embed: the first N dimensions (0: all)")
    normalize: bool | None = Field(None, strict=True, description="embed and token_embed: false leaves the "
                                                                  "vectors as the model gives them")
    add_special_tokens: bool = Field(True, strict=True, description="embed: false reads the word pieces alone")


class ClassifyRequest(VLLMFields, VLLMActivation, Strict):
    """vLLM's classify API, for a sequence classifier; Infinity's, which its client sends with raw_scores."""
    input: Text | Texts = Field(description="a text, or a list of texts (at most max_texts)")
    raw_scores: bool | None = Field(None, strict=True, description="Infinity's: sent (true: logits), the answer is "
                                    "Infinity's, per text its {score, label} highest first")
    add_special_tokens: bool = Field(True, strict=True, description="false is refused: the classifier reads [CLS]")


class CohereEmbedContent(Strict):
    type: Literal["text"] = Field(description="text: this server embeds text (Cohere's image_url parts are refused)")
    text: Text


class CohereEmbedInput(Strict):
    content: Annotated[list[CohereEmbedContent], Field(min_length=1)] = Field(
        description="its text parts, embedded as one text (joined by spaces)")


class CohereEmbedRequest(Strict):
    """Cohere's embed API, v1 and v2."""
    model: str | None = Field(None, description="ignored: the server has one model")
    texts: Texts | None = Field(None, description="the texts (at most max_texts)")
    inputs: Annotated[list[CohereEmbedInput], Field(min_length=1)] | None = Field(
        None, description="v2: the texts as content objects, in place of texts")
    images: list[str] | None = Field(None, description="refused: this server embeds text")
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = Field(
        None, description="the prompt the model was trained with for it (encode_query's, encode_document's, or "
                          "one named classification or clustering); none if it has none")
    embedding_types: Annotated[list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]],
                               Field(min_length=1)] | None = Field(
        None, description="float (default), base64 (of little-endian float32), binary or ubinary (sign bits, eight "
                          "to a byte); int8 and uint8 need calibration ranges the server does not have")
    truncate: Literal["NONE", "START", "END"] | None = Field(
        None, description="a text over the model's length: cut at its end (END, default) or start, or 413 (NONE)")
    output_dimension: int | None = Field(None, ge=1, strict=True, description="v2: each vector's first dimensions, "
                                                                              "unit length again")
    max_tokens: int | None = Field(None, ge=1, strict=True, description="v2: each text within N word pieces, cut "
                                                                        "as truncate says (NONE: a longer one is 413)")
    priority: int | None = Field(None, description="v2: ignored (one queue)")


class FillMaskParameters(Strict):
    """The Hugging Face fill-mask task's parameters (huggingface_hub's InferenceClient.fill_mask sends them)."""
    top_k: int = Field(5, ge=1, strict=True, description="tokens per [MASK]")
    targets: Annotated[list[Text], Field(min_length=1)] | None = Field(
        None, description="score these alone: tokens of the vocabulary, or a word's first word piece")


class FillMaskRequest(Strict):
    inputs: Text | Texts = Field(description="a text with one or more [MASK] tokens, or a list of them (at most "
                                             "max_texts)")
    parameters: FillMaskParameters | None = None
    options: InferenceAPIOptions | None = Field(None, description=OPTIONS)


class TokenizeRequest(Strict):
    model: str | None = Field(None, description=MODEL)
    text: Text | None = Field(None, description="the text (or send inputs, or prompt)")
    text_pair: Text | None = None
    inputs: Text | Texts | None = Field(None, description="text-embeddings-inference's field: a text or a list; the "
                                                        "answer is then its list of tokens per text")
    prompt: Text | None = Field(None, description="vLLM's field: a text; the answer is then vLLM's {count, "
                                                 "max_model_len, tokens, token_strs}")
    return_token_strs: bool | None = Field(None, strict=True, description="vLLM's, with prompt: each token's "
                                                                          "string too")
    add_special_tokens: bool = Field(True, strict=True, description="with inputs or prompt: [CLS] and [SEP] too")
    prompt_name: str | None = Field(None, description="text-embeddings-inference's field, with inputs: the prompt "
                                                      "put before each text (null: the model's default prompt, "
                                                      "if any), as /embed puts it; offsets count from the prompt")


class DecodeRequest(Strict):
    model: str | None = Field(None, description=MODEL)
    ids: TokenIds | TokenIdLists = Field(description="token ids: one list, or a list of lists")
    skip_special_tokens: bool = Field(True, strict=True)


class DetokenizeRequest(Strict):
    """vLLM's /detokenize request."""
    model: str | None = Field(None, description=MODEL)
    tokens: list[Annotated[int, Field(strict=True)]] = Field(description="token ids")


class VLLMTokenizeResponse(BaseModel):
    count: int
    max_model_len: int = Field(description="where inputs are cut or refused (/info's max_input_length)")
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str


class ExplainRequest(Strict):
    text: Text = Field(min_length=1, description="the text (for a question-answering model, the question)")
    text_pair: Text | None = Field(None, description="the pair (the context; for an encoder, the text compared)")
    target: str | None = Field(None, description="a label, an entity, answer/start/end (default: the prediction)")
    method: ExplainMethod = "integrated_gradients"
    baseline: ExplainBaseline = Field("pad", description="the token a word becomes where the method takes it away")
    steps: int = Field(DEFAULT_STEPS, ge=1, le=MAX_STEPS, strict=True,
                       description="integrated gradients' interpolation steps (steps x tokens is limited to the "
                                   "default steps x the server's max_length), the orders shapley samples on "
                                   "longer texts, or the samples of lime and smoothgrad")


# --- responses ----------------------------------------------------------------------------------------------------

class VertexRequest(Strict):
    instances: list[dict[str, Any]] = Field(min_length=1, description="text-embeddings-inference requests: "
                                            "{query, texts} to rerank, else the model's /embed, /embed_sparse "
                                            "or /predict request (at most max_texts)")


class VertexResponse(BaseModel):
    predictions: list[Any] = Field(description="each instance's answer, in order")


class EmbedResponse(BaseModel):
    embeddings: list[list[float]] | list[str] = Field(description="floats, or base64 with encoding_format base64")
    dimension: int
    pooling: str
    normalized: bool


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[int] | list[float] | list[list[float]] | str = Field(
        description="floats, or base64 of little-endian float32, or Jina's packed sign bits as integers; a "
                    "multi-vector (ColBERT) model's: one vector per token, in base64 one after the other")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    id: str = Field(description="vLLM's and Infinity's (OpenAI's answer has none)")
    object: Literal["list"] = "list"
    created: int = Field(description="vLLM's and Infinity's: when it was answered (Unix seconds)")
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage


class MultiVectorEmbedding(BaseModel):
    object: Literal["embeddings"] = "embeddings"
    index: int
    embeddings: list[list[float]] | str = Field(
        description="one vector per scored token; or base64 of them, little-endian float32, one after the other")


class MultiVectorResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[MultiVectorEmbedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class InfinityModelCard(ModelCard):
    """Infinity's model object: OpenAI's, with what its own client reads (its owned_by is always "infinity")."""
    owned_by: Literal["infinity"] = "infinity"
    stats: dict[str, Any] = Field(description="Infinity's queue figures: none here")
    backend: str = Field(description="what runs the model")
    capabilities: list[Literal["embed", "rerank", "classify"]] = Field(description="the routes it answers")


class InfinityModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[InfinityModelCard]


class LabelAnswer(BaseModel):
    text: str
    text_pair: str | None = None
    label: str
    probabilities: dict[str, float]


class LabelsAnswer(BaseModel):
    text: str
    text_pair: str | None = None
    labels: dict[str, float] = Field(description="every label over the model's threshold, most probable first")
    probabilities: dict[str, float]


class ScoreAnswer(BaseModel):
    text: str
    text_pair: str | None = None
    score: float


class Entity(BaseModel):
    type: str
    text: str = Field(description="the request's text[start:end]")
    start: int
    end: int
    score: float


class EntitiesAnswer(BaseModel):
    text: str
    entities: list[Entity]
    tags: list[str] = Field(description="one IOB2 tag per word")


class Span(BaseModel):
    text: str
    start: int = Field(description="character offsets in the context ('' at 0, 0: no answer)")
    end: int
    score: float | None


class QuestionAnswer(BaseModel):
    id: str
    question: str
    context: str
    answer: str
    start: int
    end: int
    score: float | None
    n_best: list[Span]


class PredictResponse(BaseModel):
    task: str
    predictions: list[LabelAnswer | LabelsAnswer | ScoreAnswer | EntitiesAnswer | QuestionAnswer]


class RerankResult(BaseModel):
    index: int
    score: float
    text: str | None = None


class CohereRerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, str] | str | None = Field(None, description='with return_documents: {"text": ...} for a '
                                                                    'text, else the object sent; Infinity\'s: the '
                                                                    'text')


class RerankUsage(BaseModel):
    prompt_tokens: int = Field(description="the tokens the model read (vLLM's and Infinity's name)")
    total_tokens: int = Field(description="the same (Jina's and Cohere's name)")


class CohereRerankResponse(BaseModel):
    id: str
    object: Literal["rerank"] | None = Field(None, description="Infinity's answer's (sent raw_scores)")
    created: int | None = Field(None, description="Infinity's answer's (sent raw_scores)")
    model: str
    results: list[CohereRerankResult]
    usage: RerankUsage


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    """vLLM's score answer: a score per pair, in the order of the pairs."""
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float] | list[list[float]] | str = Field(description="the task's output; base64 with "
                                                                     "encoding_format base64")


class PoolingResponse(BaseModel):
    """vLLM's pooling answer."""
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: Usage


class ClassificationData(BaseModel):
    index: int
    label: str = Field(description="the most probable label")
    probs: list[float] = Field(description="per label, in the model's label order: probabilities (softmax, or "
                                           "sigmoid for a multi-label model), or logits with use_activation false")
    num_classes: int


class ClassifyResponse(BaseModel):
    """vLLM's classify answer, or Infinity's (object "classify": per text its labels' scores)."""
    id: str
    object: Literal["list", "classify"] = "list"
    created: int
    model: str
    data: list[ClassificationData] | list[list[Prediction]]
    usage: Usage


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: list[list[float]] | dict[str, list[list[float]] | list[list[int]] | list[str]]
    texts: list[str]
    meta: dict[str, Any]


class FilledToken(BaseModel):
    """A token for a [MASK], as transformers' fill-mask pipeline gives it: the text with it is `sequence`."""
    score: float
    token: int
    token_str: str
    sequence: str


class Prediction(BaseModel):
    score: float
    label: str


class TokenPrediction(BaseModel):
    """A word piece's label (aggregation_strategy none); start and end: its characters in the text."""
    entity: str
    score: float
    index: int
    word: str
    start: int
    end: int


class EntityGroup(BaseModel):
    entity_group: str
    score: float
    word: str
    start: int
    end: int


class SpanAnswer(BaseModel):
    score: float
    start: int
    end: int
    answer: str


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="character offsets of the token in its text (null for special tokens)")
    stop: int | None


class TokenizeResponse(BaseModel):
    tokens: list[str]
    ids: list[int]
    token_type_ids: list[int]
    offsets: list[list[int]] = Field(description="(start, end) character offsets of each token")


class Limits(BaseModel):
    max_texts: int
    max_length: int
    long_text: str
    max_queue: int
    max_batch_size: int
    max_batch_tokens: int
    max_body_bytes: int
    max_concurrent_requests: int


class HealthResponse(BaseModel):
    status: str
    model: str
    architecture: str
    task: str | None
    device: str
    queued: int
    batches: int
    texts: int
    largest_batch: int
    limits: Limits


class VersionResponse(BaseModel):
    version: str


class EmbeddingModelType(BaseModel):
    pooling: str


class ClassifierModelType(BaseModel):
    id2label: dict[str, str]
    label2id: dict[str, int]


class ModelType(BaseModel):
    """TEI's kind of model, one key: an embedding model, a classifier, or a reranker (one output); none for a task
    TEI doesn't serve (see InfoResponse.task)."""
    embedding: EmbeddingModelType | None = None
    classifier: ClassifierModelType | None = None
    reranker: ClassifierModelType | None = None


class InfoResponse(BaseModel):
    """text-embeddings-inference's /info, for its clients and dashboards."""
    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_type: ModelType
    task: str | None = Field(None, description="bertforge's task, for a fine-tuned model")
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
