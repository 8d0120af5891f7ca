"""`bertforge serve`: the HTTP inference server (/predict, /embed, /embed_sparse, /v1/embeddings, /rerank,
/tokenize, /attention, /health, /metrics, /docs)."""

from __future__ import annotations

import argparse
import dataclasses
import os

from bertforge.cli.arguments import (
    add_flag_table,
    add_inference_arguments,
    add_model_argument,
    finite_float,
    inference_options,
    number_range,
    path_text,
    port_number,
    positive_float,
    positive_int,
)
from bertforge.cli.json_log import log_as_json
from bertforge.errors import ConfigError
from bertforge.inference.serve.settings import (
    API_KEY_VARIABLE,
    LONG_TEXT_POLICIES,
    MAX_RELEASE_MEMORY_AFTER,
    MAX_WAIT_MS,
    SERVER_POOLINGS,
    ServeSettings,
)

# flag -> (ServeSettings field, type, help), as cli/arguments.add_flag_table reads it; defaults are the dataclass's.
FLAGS = {
    "--max-batch-size": ("max_batch_size", positive_int, "texts per forward pass"),
    "--max-batch-tokens": ("max_batch_tokens", positive_int, "padded tokens (texts x longest) per forward pass"),
    "--max-wait-ms": ("max_wait_ms", number_range("max_wait_ms", finite_float, 0, MAX_WAIT_MS),
                      "how long a text may wait for others to share its forward pass"),
    "--max-queue": ("max_queue", positive_int, "texts waiting at most; requests beyond that get 429 (retry)"),
    "--max-texts": ("max_texts", positive_int, "texts (or questions) per request at most (more get 413)"),
    "--max-concurrent-requests": ("max_concurrent_requests", positive_int,
                                  "requests the routes that run the model take at once; more get 429 (retry), as "
                                  "text-embeddings-inference's flag of that name answers"),
    "--max-length": ("max_length", positive_int, "tokens per text for /embed, /tokenize and an encoder's /rerank (a "
                                                 "fine-tuned model's /predict uses the max_length it was trained "
                                                 "with)"),
    "--long-text": ("long_text", LONG_TEXT_POLICIES, "a text over the limit is cut (truncate; windows where the "
                                                     "model was trained with them) or answered with 413 (refuse)"),
    "--pooling": ("pooling", SERVER_POOLINGS,
                  "an encoder's pooling for /embed and the routes built on it: cls, mean, max (and "
                  "sentence-transformers' other modes), or splade (a "
                  "masked-LM model's SPLADE vectors, for /embed_sparse); default: the checkpoint's "
                  "sentence-transformers layout, else mean"),
    "--attention-max-length": ("attention_max_length", positive_int,
                               "tokens the attention views of /attention and of the /explain page read at most "
                               "(the page grows with the square of this)"),
    "--max-body-bytes": ("max_body_bytes", positive_int, "request body size at most (larger gets 413 before it is "
                                                         "read)"),
    "--read-timeout": ("read_timeout", positive_float, "seconds a client has to send a whole request; slower ones "
                                                       "are disconnected"),
    "--idle-timeout": ("idle_timeout", positive_float, "seconds an idle keep-alive connection stays open"),
    "--release-memory-after": ("release_memory_after", number_range("release_memory_after", finite_float, 0,
                                                                   MAX_RELEASE_MEMORY_AFTER),
                               "seconds without work after which the server gives the memory its batches freed "
                               "back to the system (glibc keeps it for speed under load); 0: never"),
    "--default-prompt-name": ("default_prompt_name", str,
                              "an encoder's sentence-transformers prompt (by name, as in its "
                              "config_sentence_transformers.json) put before each text whose request names none "
                              "(default: the model's default_prompt_name, if any)"),
    "--default-prompt": ("default_prompt", str, "a text put before each text whose request names no prompt, "
                                                "instead of a prompt by name (\"query: \")"),
    "--served-model-name": ("served_model_name", str, "the model's name in answers (/info, /v1/models, the "
                                                      "OpenAI APIs' model field; default: --model)"),
}


# text-embeddings-inference's spellings, so that its command lines (a container's arguments) start this server too;
# hidden, as the flags they stand for are shown.
TEI_FLAGS = {"--max-client-batch-size": "--max-texts", "--max-batch-requests": "--max-batch-size",
             "--payload-limit": "--max-body-bytes"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=port_number, default=8000, help="TCP port to listen on")
    hidden = {"default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
    parser.add_argument("--model-id", dest="model", type=path_text, **hidden)  # TEI's --model and --host
    parser.add_argument("--hostname", dest="host", **hidden)
    parser.add_argument("--auto-truncate", dest="long_text", action="store_const", const="truncate", **hidden)
    add_flag_table(parser, FLAGS, {field.name: field.default for field in dataclasses.fields(ServeSettings)}.get,
                   aliases=TEI_FLAGS)
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: the "
                             f"{API_KEY_VARIABLE} environment variable; unset: no key)")
    parser.add_argument("--cors-allow-origin", action="append", default=None, metavar="ORIGIN",
                        help="let web pages of ORIGIN (https://app.example, or *) call the server from a browser; "
                             "repeat, or separate with commas, for several (default: none)")
    parser.add_argument("--json-output", action="store_true",
                        help="write the log as JSON lines (timestamp, level, target, message, error), as "
                             "text-embeddings-inference's flag of that name does")
    add_inference_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from bertforge.inference.serve.app import serve

    if args.json_output:  # first, so that a bad setting's error is a JSON line too
        log_as_json()
    given = {field: getattr(args, field) for field, _, _ in FLAGS.values() if getattr(args, field) is not None}
    origins = tuple(origin.strip() for flag in args.cors_allow_origin or () for origin in flag.split(",")
                    if origin.strip())
    settings = ServeSettings(**given, api_key=api_key(args.api_key), cors_allow_origins=origins)
    serve(args.model, host=args.host, port=args.port, settings=settings, inference=inference_options(args),
          json_logs=args.json_output)
    return 0


def api_key(flag: str | None) -> str | None:
    """--api-key, else $BERTFORGE_API_KEY, else None (no key). An empty one is refused rather than read as none
    (docker-compose's KEY=${X:-} sets it empty): serving without a key by accident is worse than not starting."""
    if flag is not None:
        if not flag.strip():
            raise ConfigError("--api-key is empty; give a key, or leave the flag out to serve without one")
        return flag
    key = os.environ.get(API_KEY_VARIABLE)
    if key is not None and not key.strip():
        raise ConfigError(f"the environment variable {API_KEY_VARIABLE} is empty; give a key, or unset it to serve "
                          "without one")
    return key
