"""The tokenizer over HTTP: /tokenize (bertforge's form, and text-embeddings-inference's token lists) and TEI's
/decode."""

import asyncio

from bertforge.inference.serve import schemas
from bertforge.inference.serve.errors import ERRORS
from bertforge.inference.serve.limits import HTTPError
from bertforge.inference.serve.routes import Routes, Served
from bertforge.inference.serve.service import UNLIMITED, tei_inputs
from bertforge.inference.serve.tei import simple_tokens

router = Routes()


@router.post("/tokenize", response_model=schemas.TokenizeResponse | list[list[schemas.SimpleToken]],
             responses=ERRORS)
async def tokenize(request: schemas.TokenizeRequest, served: Served):
    """Tokens, ids, segment ids and (start, end) character offsets ((0, 0) for special tokens). With
    text-embeddings-inference's {"inputs": ...}, its list of tokens per text, after the prompt /embed puts before
    it (prompt_name, else the model's default prompt), as TEI tokenizes it."""
    if (request.text is None) == (request.inputs is None):
        raise HTTPError(422, 'send "text" (and "text_pair") or "inputs" (a text or a list), one of them')
    if request.inputs is None and request.prompt_name is not None:
        raise HTTPError(422, '"prompt_name" goes with "inputs", not "text"')
    tokenizer = served.tokenizer
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
