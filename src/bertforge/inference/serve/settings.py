"""The server's settings: batching, and the limits that keep one client from exhausting the server."""

from __future__ import annotations

from dataclasses import dataclass

from bertforge.errors import ConfigError, check_choice
from bertforge.inference.attention_view import DEFAULT_MAX_TOKENS
from bertforge.inference.features import POOLINGS
from bertforge.inference.serve.batcher import RELEASE_MEMORY_AFTER
from bertforge.validation import check_number

LONG_TEXT_POLICIES = ("truncate", "refuse")
# text-embeddings-inference's spellings of poolings bertforge names otherwise (its --pooling last-token)
TEI_POOLINGS = {"last-token": "lasttoken"}
# An encoder's pooling for the whole server (text-embeddings-inference's --pooling): a dense one, or SPLADE.
SERVER_POOLINGS = (*POOLINGS, *TEI_POOLINGS, "splade")
API_KEY_VARIABLE = "BERTFORGE_API_KEY"  # where `bertforge serve` reads the API key when --api-key isn't given
# A text waits for company at most this long: a minute is already far past any client's patience, and 1e308 ms
# overflowed the worker's timed wait (threading's timeouts end at about 292 years).
MAX_WAIT_MS = 60_000
MAX_RELEASE_MEMORY_AFTER = 86_400  # a day, for the same reason; 0 says never


@dataclass
class ServeSettings:
    """Batching and limits; every size is checked here, so a bad flag fails before the model loads."""

    max_batch_size: int = 32  # texts per forward pass
    max_batch_tokens: int = 16384  # padded tokens (rows x longest row) per forward pass
    max_wait_ms: float = 5.0  # how long the oldest waiting text may wait for company
    max_queue: int = 256  # texts waiting; a request is admitted whole while fewer wait, else it gets 429
    max_texts: int = 64  # texts (or questions) per request
    # requests at once over the routes that run the model; more get 429 (text-embeddings-inference's flag and default)
    max_concurrent_requests: int = 512
    max_length: int = 512  # tokens per text (or pair) for /embed, /tokenize, /rerank of an encoder
    long_text: str = "truncate"  # or "refuse": 413 for a text over the limit (a QA context is otherwise windowed)
    attention_max_length: int = DEFAULT_MAX_TOKENS  # the viewer page grows with the square of this
    max_body_bytes: int = 1_000_000  # request body; larger gets 413 before it is read
    read_timeout: float = 30.0  # seconds a client has to send a whole request (headers and body)
    idle_timeout: float = 5.0  # seconds an idle keep-alive connection stays open
    # seconds without work after which the worker gives the memory its batches freed back to the system; 0: never
    release_memory_after: float = RELEASE_MEMORY_AFTER
    api_key: str | None = None  # when set, every route but /health needs it (Authorization: Bearer KEY)
    # web pages of these origins ("https://app.example", or "*") may call the server from a browser (CORS)
    cors_allow_origins: tuple[str, ...] = ()
    # an encoder's pooling (SERVER_POOLINGS; "splade": a masked-LM model's SPLADE vectors); None: its layout's
    pooling: str | None = None
    # the model's name in answers (/info's model_id, the OpenAI APIs' model, /v1/models); None: its path
    served_model_name: str | None = None
    # an encoder's prompt for texts whose request names none (text-embeddings-inference's flags): one of its
    # sentence-transformers prompts by name, or a text ("query: "); None: its layout's default_prompt_name, if any
    default_prompt_name: str | None = None
    default_prompt: str | None = None

    def __post_init__(self):
        for name in ("max_batch_size", "max_batch_tokens", "max_queue", "max_texts", "max_concurrent_requests",
                     "max_length", "attention_max_length", "max_body_bytes"):
            check_number(name, getattr(self, name), minimum=1, integer=True)
        check_number("max_wait_ms", self.max_wait_ms, minimum=0, maximum=MAX_WAIT_MS)
        for name in ("read_timeout", "idle_timeout"):  # seconds
            check_number(name, getattr(self, name), minimum=0, exclusive=True)
        check_number("release_memory_after", self.release_memory_after, minimum=0, maximum=MAX_RELEASE_MEMORY_AFTER)
        if self.pooling is not None:
            check_choice(self.pooling, SERVER_POOLINGS, "pooling")
            self.pooling = TEI_POOLINGS.get(self.pooling, self.pooling)
        check_choice(self.long_text, LONG_TEXT_POLICIES, "long_text")
        if self.served_model_name is not None and (not isinstance(self.served_model_name, str)
                                                   or not self.served_model_name.strip()):
            raise ConfigError(f"served_model_name must be a name, got {self.served_model_name!r:.60}")
        if self.default_prompt_name is not None and self.default_prompt is not None:
            raise ConfigError("default_prompt_name and default_prompt: give one default prompt, by name or as text")
        for name in ("default_prompt_name", "default_prompt"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a text, got {getattr(self, name)!r:.60}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("the API key is empty or not text; give a key or none")
        origins = self.cors_allow_origins
        if isinstance(origins, str) or not isinstance(origins, (list, tuple)) or \
                not all(isinstance(origin, str) for origin in origins):
            raise ConfigError(f"cors_allow_origins must be a list of origins, got {origins!r:.60}")
        self.cors_allow_origins = tuple(origins)
        for origin in self.cors_allow_origins:
            # what a browser sends as Origin: scheme://host[:port], no path and no trailing slash
            if origin != "*" and (not origin.startswith(("http://", "https://")) or "/" in origin.split("://", 1)[1]):
                raise ConfigError(f"CORS origin {origin!r} must be scheme://host[:port] (e.g. https://app.example, "
                                  f"no trailing slash) or *")
