"""The tokenizer over HTTP: /tokenize (bertforge's form, text-embeddings-inference's token lists and vLLM's ids),
TEI's /decode and vLLM's /detokenize."""

import asyncio

from bertforge.inference.serve import schemas
from bertforge.inference.serve.errors import ERRORS
from bertforge.inference.serve.limits import HTTPError
from bertforge.inference.serve.routes import Routes, Served
from bertforge.inference.serve.service import UNLIMITED, tei_inputs
from bertforge.inference.serve.tei import simple_tokens

router = Routes()


@router.post("/tokenize", response_model=schemas.TokenizeResponse | list[list[schemas.SimpleToken]]
             | schemas.VLLMTokenizeResponse, responses=ERRORS)
async def tokenize(request: schemas.TokenizeRequest, served: Served):
    """Tokens, ids, segment ids and (start, end) character offsets ((0, 0) for special tokens). With
    text-embeddings-inference's {"inputs": ...}, its list of tokens per text, after the prompt /embed puts before
    it (prompt_name, else the model's default prompt), as TEI tokenizes it. With vLLM's {"prompt": ...}, its
    ids, their count and max_model_len, where inputs are cut or refused, as /info's max_input_length (every token,
    however long the text)."""
    if sum(given is not None for given in (request.text, request.inputs, request.prompt)) != 1:
        raise HTTPError(422, 'send "text" (and "text_pair"), "inputs" (a text or a list) or "prompt", one of them')
    if request.inputs is None and request.prompt_name is not None:
        raise HTTPError(422, '"prompt_name" goes with "inputs", not "text"')
    if request.prompt is None and request.return_token_strs is not None:
        raise HTTPError(422, '"return_token_strs" goes with "prompt"')
    tokenizer = served.tokenizer
    if request.prompt is not None:
        row = (await asyncio.to_thread(served.encode_texts, [request.prompt], None, UNLIMITED, False, False, "right",
                                       request.add_special_tokens))[0]
        ids = row["input_ids"]
        return {"count": len(ids), "max_model_len": served.input_limit(), "tokens": ids,
                "token_strs": tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None}
    if request.inputs is not None:
        if request.text_pair is not None:
            raise HTTPError(422, '"text_pair" goes with "text", not "inputs"')
        texts = tei_inputs(request.inputs)
        served.check_count(len(texts))
        prompt = served.layout().prompt(request.prompt_name)
        texts = [prompt + text for text in texts]
        # as TEI: every token, however long the text (tokenizing is not reading)
        rows = await asyncio.to_thread(served.encode_texts, texts, None, UNLIMITED, True, False, "right",
                                       request.add_special_tokens)
        return [simple_tokens(text, row, tokenizer.convert_ids_to_tokens(row["input_ids"]))
                for text, row in zip(texts, rows)]
    pairs = None if request.text_pair is None else [request.text_pair]
    row = (await asyncio.to_thread(served.encode_texts, [request.text], pairs, served.max_length, True))[0]
    return {"tokens": tokenizer.convert_ids_to_tokens(row["input_ids"]), "ids": row["input_ids"],
            "token_type_ids": row["token_type_ids"], "offsets": row["offset_mapping"]}


@router.post("/decode", response_model=list[str], responses=ERRORS)
async def decode(request: schemas.DecodeRequest, served: Served):
    """text-embeddings-inference's: the text of each list of token ids."""
    id_lists = tei_inputs(request.ids)
    served.check_count(len(id_lists), "id lists")
    served.check_ids(id_lists)
    return served.tokenizer.batch_decode(id_lists, skip_special_tokens=request.skip_special_tokens)


@router.post("/detokenize", response_model=schemas.DetokenizeResponse, responses=ERRORS)
async def detokenize(request: schemas.DetokenizeRequest, served: Served):
    """vLLM's: the text of the token ids, special tokens kept (as vLLM decodes them)."""
    served.check_ids([request.tokens])
    return {"prompt": served.tokenizer.decode(request.tokens)}
