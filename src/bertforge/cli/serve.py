"""`bertforge serve`: the HTTP inference server (/predict, /embed, /embed_sparse, /v1/embeddings, /rerank,
/tokenize, /attention, /health, /metrics, /docs)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
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

TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def switch(text: str) -> bool:
    """An environment variable's on or off: TEI (clap) takes true and false; 1/0, yes/no and on/off too, as many
    programs' variables do."""
    word = text.strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        raise argparse.ArgumentTypeError(f"must be true or false, got {text}")
    return word in TRUE_WORDS


# text-embeddings-inference reads each of its flags from an environment variable too (clap's `env`: the flag's name
# upper-cased, as `docker run -e MODEL_ID=...` and Kubernetes manifests set them): bertforge serve reads those of the
# flags it has, where the command line doesn't give the flag. Variable -> (its flag, where the value goes in the
# arguments, how its text is read). JSON_OUTPUT first: run() reads it before the others, whose errors it formats.
TEI_VARIABLES = {
    "JSON_OUTPUT": ("--json-output", "json_output", switch),
    "MODEL_ID": ("--model", "model", path_text),
    # A bare PORT is set on purpose by the platforms that say where to listen (Cloud Run, Heroku, Render).
    "PORT": ("--port", "port", port_number),
    **{variable: (flag, FLAGS[flag][0], FLAGS[flag][1]) for variable, flag in {
        "SERVED_MODEL_NAME": "--served-model-name", "POOLING": "--pooling",
        "MAX_CONCURRENT_REQUESTS": "--max-concurrent-requests", "MAX_BATCH_TOKENS": "--max-batch-tokens",
        "MAX_BATCH_REQUESTS": "--max-batch-size", "MAX_CLIENT_BATCH_SIZE": "--max-texts",
        "PAYLOAD_LIMIT": "--max-body-bytes", "DEFAULT_PROMPT_NAME": "--default-prompt-name",
        "DEFAULT_PROMPT": "--default-prompt"}.items()},
    # TEI's false is its default: a text over the limit is refused unless its request says truncate.
    "AUTO_TRUNCATE": ("--auto-truncate", "long_text", lambda text: "truncate" if switch(text) else "refuse"),
    # TEI takes the variable's text as one origin; commas separate several, as --cors-allow-origin's do
    "CORS_ALLOW_ORIGIN": ("--cors-allow-origin", "cors_allow_origin", lambda text: [text]),
}
# Also TEI's API_KEY (api_key below): a name so common that another program's key may be found there, but then
# clients are refused (401, which says why) where ignoring it would serve a TEI deployment that relies on it to
# anyone. Not read: HOSTNAME (TEI's --hostname), which every shell and container sets to the machine's own name:
# read, it would move the server from loopback to the address of that name (the network's, in a container) unasked.
# TEI's variables of what bertforge doesn't do (REVISION, TOKENIZATION_WORKERS, DENSE_PATH, DEVICE_ID, HF_TOKEN,
# HF_API_TOKEN, HUGGINGFACE_HUB_CACHE, UDS_PATH, DISABLE_SPANS, OTLP_ENDPOINT, OTLP_SERVICE_NAME, PROMETHEUS_PORT)
# are ignored, as TEI ignores them unset; DTYPE alone is warned about (dtype_warning).
TEI_API_KEY_VARIABLE = "API_KEY"
DTYPE_VARIABLE = "DTYPE"
# Settings given two ways: either flag on the command line leaves both variables unread.
ONE_SETTING = {"default_prompt_name": "default_prompt", "default_prompt": "default_prompt_name"}


class DefaultText(str):
    """A flag's default value, told apart from the same value given on the command line (which an environment
    variable doesn't replace)."""


class DefaultNumber(int):
    __doc__ = DefaultText.__doc__


def given(value) -> bool:
    """Whether the command line gave a flag its value (FLAGS' flags and switches default to None or False)."""
    return value is not None and value is not False and not isinstance(value, (DefaultText, DefaultNumber))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.set_defaults(model=DefaultText("default"))  # which MODEL_ID may replace
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=port_number, default=DefaultNumber(8000), help="TCP port to listen on")
    parser.epilog = ("text-embeddings-inference's environment variables set the flags they name where the command "
                     "line doesn't give them: MODEL_ID, PORT, MAX_CLIENT_BATCH_SIZE, AUTO_TRUNCATE, API_KEY and the "
                     "rest of its flags that bertforge has (not HOSTNAME, which every shell sets).")
    hidden = {"default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
    parser.add_argument("--model-id", dest="model", type=path_text, **hidden)  # TEI's --model and --host
    parser.add_argument("--hostname", dest="host", **hidden)
    parser.add_argument("--auto-truncate", dest="long_text", action="store_const", const="truncate", **hidden)
    add_flag_table(parser, FLAGS, {field.name: field.default for field in dataclasses.fields(ServeSettings)}.get,
                   aliases=TEI_FLAGS)
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: the "
                             f"{API_KEY_VARIABLE} environment variable, else text-embeddings-inference's "
                             f"{TEI_API_KEY_VARIABLE}; neither set: no key)")
    parser.add_argument("--cors-allow-origin", action="append", default=None, metavar="ORIGIN",
                        help="let web pages of ORIGIN (https://app.example, or *) call the server from a browser; "
                             "repeat, or separate with commas, for several (default: none)")
    parser.add_argument("--json-output", action="store_true",
                        help="write the log as JSON lines (timestamp, level, target, message, error), as "
                             "text-embeddings-inference's flag of that name does")
    add_inference_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from bertforge.inference.serve.app import serve

    read = read_environment(args, ["JSON_OUTPUT"])
    if args.json_output:  # first, so that a bad setting's error (a bad variable's too) is a JSON line too
        log_as_json()
    read += read_environment(args, [variable for variable in TEI_VARIABLES if variable != "JSON_OUTPUT"])
    key = api_key(args.api_key)
    if args.api_key is None and api_key_variable() == TEI_API_KEY_VARIABLE:
        read.append(TEI_API_KEY_VARIABLE)
    if read:  # so that a setting nobody passed is explained in the log (names only: one may be the key)
        logging.getLogger("bertforge.progress").info("read text-embeddings-inference's environment variables %s",
                                                     ", ".join(read))
    warning = dtype_warning(args.precision)
    if warning:
        logging.getLogger("bertforge").warning(warning)
    chosen = {field: getattr(args, field) for field, _, _ in FLAGS.values() if getattr(args, field) is not None}
    origins = tuple(origin.strip() for flag in args.cors_allow_origin or () for origin in flag.split(",")
                    if origin.strip())
    settings = ServeSettings(**chosen, api_key=key, cors_allow_origins=origins)
    serve(args.model, host=args.host, port=args.port, settings=settings, inference=inference_options(args),
          json_logs=args.json_output)
    return 0


def read_environment(args: argparse.Namespace, variables: list[str]) -> list[str]:
    """Set each flag that the command line didn't give from its TEI_VARIABLES variable, where that is set; the
    variables read. A bad value is a one-line error naming the variable, worded as the flag's own."""
    on_command_line = {destination for _, destination, _ in TEI_VARIABLES.values()
                       if given(getattr(args, destination))}
    read = []
    for variable in variables:
        flag, destination, kind = TEI_VARIABLES[variable]
        text = os.environ.get(variable)
        if text is None or {destination, ONE_SETTING.get(destination)} & on_command_line:
            continue
        if not text.strip():  # docker-compose's X=${Y:-}: a value meant and lost, not read as unset
            raise ConfigError(f"the environment variable {variable} ({flag}) is empty; give a value, or unset it")
        if callable(kind):
            try:
                value = kind(text)
            except argparse.ArgumentTypeError as problem:
                raise ConfigError(f"the environment variable {variable} ({flag}) {problem}") from None
        elif text in kind:  # a table of choices
            value = text
        else:
            raise ConfigError(f"the environment variable {variable} ({flag}) must be one of {', '.join(kind)}, "
                              f"got {text}")
        setattr(args, destination, value)
        read.append(variable)
    return read


def dtype_warning(precision: str) -> str | None:
    """What to say of TEI's DTYPE, which is not read: bertforge has no float16, and a deployment that chose it for
    memory or speed should know that the model runs in --precision."""
    dtype = os.environ.get(DTYPE_VARIABLE)
    if dtype is None or dtype.strip() == "float32" and precision == "fp32":
        return None
    return (f"the environment variable {DTYPE_VARIABLE}={dtype} (text-embeddings-inference's) is not read: the "
            f"model runs in --precision {precision} (fp32, bf16, auto or int8)")


def api_key_variable() -> str | None:
    """The environment variable the API key is read from where --api-key isn't given: bertforge's own, else TEI's."""
    return next((variable for variable in (API_KEY_VARIABLE, TEI_API_KEY_VARIABLE) if variable in os.environ), None)


def api_key(flag: str | None) -> str | None:
    """--api-key, else $BERTFORGE_API_KEY, else $API_KEY (TEI's), else None (no key). An empty one is refused rather
    than read as none (docker-compose's KEY=${X:-} sets it empty): serving without a key by accident is worse than
    not starting."""
    if flag is not None:
        if not flag.strip():
            raise ConfigError("--api-key is empty; give a key, or leave the flag out to serve without one")
        return flag
    variable = api_key_variable()
    if variable is None:
        return None
    key = os.environ[variable]
    if not key.strip():
        raise ConfigError(f"the environment variable {variable} is empty; give a key, or unset it to serve without "
                          "one")
    return key
