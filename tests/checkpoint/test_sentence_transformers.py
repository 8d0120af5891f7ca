"""The sentence-transformers layout: embed, similarity and extract_features follow modules.json by default, and
give sentence-transformers' own vectors (the reference: SentenceTransformer.encode on the same directory)."""

import importlib
import json

import numpy as np
import pytest
import torch

from bertforge import BertModel, BertTokenizer, ConfigError, extract_features
from bertforge.checkpoint.sentence_transformers import SentenceEmbedding, read_sentence_embedding
from bertforge.cli.main import main
from bertforge.errors import BertforgeError

sentence_transformers = pytest.importorskip("sentence_transformers")
try:  # Transformer, Pooling, Normalize: sentence-transformers 6 moved them from sentence_transformers.models
    st_modules = importlib.import_module("sentence_transformers.sentence_transformer.modules")
except ImportError:
    st_modules = importlib.import_module("sentence_transformers.models")


@pytest.fixture(scope="module")
def long_texts(squad_contexts, tokenizer):
    """Real paragraphs longer than all-MiniLM-L6-v2's max_seq_length (256), and two short sentences."""
    long = [text for text in squad_contexts if len(tokenizer(text, truncation=False)["input_ids"]) > 300][:4]
    assert len(long) == 4
    return long + ["A man is playing a guitar.", "Short."]


@pytest.fixture(scope="module")
def reference(minilm_dir):
    return sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")


def cosines(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    ours, theirs = torch.from_numpy(ours).double(), torch.from_numpy(theirs).double()
    return torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).numpy()


def test_the_default_model_says_mean_256_normalized(minilm_dir):
    assert read_sentence_embedding(minilm_dir) == SentenceEmbedding(pooling="mean", max_length=256, normalize=True)


def test_embed_default_equals_sentence_transformers_encode(tmp_path, long_texts, reference):
    (tmp_path / "texts.txt").write_text("\n".join(long_texts) + "\n", encoding="utf-8")
    assert main(["embed", "--input", str(tmp_path / "texts.txt"), "--output", str(tmp_path / "v.npy")]) == 0
    ours = np.load(tmp_path / "v.npy")
    theirs = reference.encode(long_texts, convert_to_numpy=True)
    assert cosines(ours, theirs).min() > 0.99999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_flags_override_the_layout(minilm, tokenizer, long_texts, hf_minilm):
    """--pool cls --max-length 512 --no-normalize: the raw [CLS] vector of the whole text, as transformers gives."""
    ours = extract_features(minilm, tokenizer, long_texts[:2], pooling="cls", max_length=512, normalize=False)
    with torch.inference_mode():
        for text, vector in zip(long_texts[:2], ours):
            encoded = tokenizer(text, max_length=512, return_tensors="pt")
            expected = hf_minilm(**encoded).last_hidden_state[0, 0]
            torch.testing.assert_close(vector, expected, atol=1e-5, rtol=1e-5)
            assert encoded["input_ids"].shape[1] > 256


@pytest.mark.parametrize("mode, normalize", [("cls", False), ("max", True)])
def test_a_saved_sentence_transformers_model_follows_its_own_layout(tmp_path, minilm_dir, long_texts, mode,
                                                                    normalize):
    """A model directory written by sentence-transformers itself, with another pooling and length; and a copy
    bertforge saves of it, which sentence-transformers pools as the original."""
    models = st_modules
    transformer = models.Transformer(str(minilm_dir), max_seq_length=128)
    modules = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling_mode=mode)]
    if normalize:
        modules.append(models.Normalize())
    reference = sentence_transformers.SentenceTransformer(modules=modules, device="cpu")
    reference.save(str(tmp_path))
    expected = reference.encode(long_texts, convert_to_numpy=True)
    ours = extract_features(BertModel.from_pretrained(tmp_path), BertTokenizer.from_pretrained(tmp_path),
                            long_texts)
    assert cosines(ours.numpy(), expected).min() > 0.99999
    # sentence-transformers 6 keeps max_seq_length as the tokenizer's model_max_length
    assert read_sentence_embedding(tmp_path) == SentenceEmbedding(pooling=mode, normalize=normalize,
                                                                  prompts=reference.prompts,  # 5+: empty ones
                                                                  similarity_fn_name="cosine")
    assert BertTokenizer.from_pretrained(tmp_path).model_max_length == 128
    BertModel.from_pretrained(tmp_path).save_pretrained(tmp_path / "copy")
    BertTokenizer.from_pretrained(tmp_path).save_pretrained(tmp_path / "copy")
    copy = sentence_transformers.SentenceTransformer(str(tmp_path / "copy"), device="cpu")
    assert cosines(copy.encode(long_texts, convert_to_numpy=True), expected).min() > 0.99999


def test_export_keeps_the_layout(tmp_path, minilm_dir, long_texts, reference):
    """`export hf` (save_pretrained) of an encoder writes the layout it was loaded with: sentence-transformers and
    `embed` pool the copy as the original (mean, 256 tokens, unit length)."""
    assert main(["export", "hf", "--model", str(minilm_dir), "--output", str(tmp_path / "copy")]) == 0
    copy = sentence_transformers.SentenceTransformer(str(tmp_path / "copy"), device="cpu")
    expected = reference.encode(long_texts, convert_to_numpy=True)
    assert cosines(copy.encode(long_texts, convert_to_numpy=True), expected).min() > 0.99999
    assert read_sentence_embedding(tmp_path / "copy") == read_sentence_embedding(minilm_dir)
    ours = extract_features(BertModel.from_pretrained(tmp_path / "copy"), BertTokenizer.from_pretrained(minilm_dir),
                            long_texts)
    assert cosines(ours.numpy(), expected).min() > 0.99999


def test_the_layout_before_sentence_transformers_1_with_the_model_in_a_subfolder(tmp_path, minilm_dir, long_texts,
                                                                                 reference):
    """modules.json at the top, the model in 0_Transformer/: loads from the top folder, pooled as it says."""
    import shutil

    shutil.copytree(minilm_dir, tmp_path / "0_Transformer", ignore=shutil.ignore_patterns("modules.json", "1_*"))
    shutil.copytree(minilm_dir / "1_Pooling", tmp_path / "1_Pooling")
    modules = json.loads((minilm_dir / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert not (tmp_path / "config.json").exists()
    (tmp_path / "texts.txt").write_text("\n".join(long_texts) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(tmp_path), "--input", str(tmp_path / "texts.txt"),
                 "--output", str(tmp_path / "v.npy")]) == 0
    expected = reference.encode(long_texts, convert_to_numpy=True)
    assert cosines(np.load(tmp_path / "v.npy"), expected).min() > 0.99999
    np.testing.assert_allclose(np.linalg.norm(np.load(tmp_path / "v.npy"), axis=1), 1.0, atol=1e-5)


def test_unsupported_modules_are_one_line_errors(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "attention"}))
    with pytest.raises(ConfigError, match=r"1_Pooling/config.json: pooling mode 'attention' is not supported"):
        read_sentence_embedding(tmp_path)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert read_sentence_embedding(tmp_path).pooling == "mean"  # the Dense module is read_dense_layers'
    modules = json.loads((tmp_path / "modules.json").read_text())
    (tmp_path / "modules.json").write_text(json.dumps(modules + [{"idx": 3, "name": "3", "path": "3_Mine",
                                                                  "type": "my_package.Reranker"}]))
    with pytest.raises(ConfigError, match=r"modules.json: module 'my_package.Reranker' is not supported"):
        read_sentence_embedding(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([modules[0], modules[2], modules[1]]))
    with pytest.raises(ConfigError, match=r"modules.json: a Dense module on token vectors \(before Pooling\) is not"):
        read_sentence_embedding(tmp_path)


def dense_layout(folder, minilm_dir, dense_options, normalize=True, pooling="cls"):
    """A layout sentence-transformers writes with Dense layers after pooling (LaBSE: [CLS], Dense 768 -> 768 with
    Tanh, Normalize), their weights random."""
    transformer = st_modules.Transformer(str(minilm_dir), max_seq_length=128)
    modules = [transformer, st_modules.Pooling(384, pooling_mode=pooling)]
    torch.manual_seed(0)
    for options in dense_options:
        modules.append(st_modules.Dense(**options))
    if normalize:
        modules.append(st_modules.Normalize())
    sentence_transformers.SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


@pytest.mark.parametrize("dense_options, normalize", [
    ([{"in_features": 384, "out_features": 256}], True),  # LaBSE's kind: Tanh, bias
    ([{"in_features": 384, "out_features": 384, "bias": False, "activation_function": torch.nn.Identity(),
       "use_residual": True},
      {"in_features": 384, "out_features": 96, "activation_function": torch.nn.GELU(), "use_residual": True}], False),
])
def test_dense_layers_project_as_sentence_transformers(dense_options, normalize, minilm_dir, pooled_texts, tmp_path):
    """Dense layers after pooling, as sentence-transformers saved them: the API, the command line, the server and
    a copy bertforge saves, which sentence-transformers reads back to the same vectors."""
    from fastapi.testclient import TestClient

    from bertforge import SentenceEncoder
    from bertforge.inference.features import Dense
    from bertforge.inference.serve.app import load_app
    reference = dense_layout(tmp_path / "model", minilm_dir, dense_options, normalize)
    theirs = reference.encode(pooled_texts)
    width = dense_options[-1]["out_features"]
    assert theirs.shape == (len(pooled_texts), width)
    encoder = SentenceEncoder(tmp_path / "model")
    assert np.abs(encoder.encode(pooled_texts) - theirs).max() < 1e-5
    assert encoder.get_embedding_dimension() == reference.get_embedding_dimension() == width
    assert isinstance(encoder[2], Dense) and len(encoder) == len(reference)
    ours = extract_features(BertModel.from_pretrained(tmp_path / "model"), BertTokenizer.from_pretrained(
        tmp_path / "model"), pooled_texts)
    assert np.abs(ours.numpy() - theirs).max() < 1e-5
    (tmp_path / "texts.txt").write_text("\n".join(pooled_texts) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(tmp_path / "model"), "--input", str(tmp_path / "texts.txt"),
                 "--output", str(tmp_path / "v.npy")]) == 0
    assert np.abs(np.load(tmp_path / "v.npy") - theirs).max() < 1e-5
    with TestClient(load_app(tmp_path / "model")) as client:
        served = client.post("/embed", json={"texts": pooled_texts}).json()
        openai = client.post("/v1/embeddings", json={"input": pooled_texts[:2]}).json()
    assert served["dimension"] == width and np.abs(np.asarray(served["embeddings"]) - theirs).max() < 1e-5
    assert cosines(np.asarray([item["embedding"] for item in openai["data"]], dtype=np.float32),
                   theirs[:2]).min() > 0.99999
    encoder.save(tmp_path / "copy")
    # the BERT checkpoint holds BERT's tensors alone: the Dense weights are the layout's, in their own folders, and
    # loading a BERT state dict (transformers' names) into the encoder leaves them as they are
    from safetensors.torch import load_file
    assert not any("dense.0" in name or "linear" in name for name in load_file(tmp_path / "copy" / "model.safetensors"))
    encoder.model.load_state_dict(reference[0].auto_model.state_dict())
    assert np.abs(encoder.encode(pooled_texts) - theirs).max() < 1e-5
    assert sorted(path.name for path in (tmp_path / "copy").glob("*_Dense")) == sorted(
        path.name for path in (tmp_path / "model").glob("*_Dense"))
    copy = sentence_transformers.SentenceTransformer(str(tmp_path / "copy"), device="cpu")
    assert np.abs(copy.encode(pooled_texts) - theirs).max() < 1e-5


def test_sentence_transformers_losses_train_the_dense_layers(minilm_dir, tmp_path):
    from bertforge import SentenceEncoder
    dense_layout(tmp_path, minilm_dir, [{"in_features": 384, "out_features": 64}])
    encoder = SentenceEncoder(tmp_path).train()
    features = encoder.tokenize(["A man is eating food.", "A man eats."])
    loss = encoder(features)["sentence_embedding"].sum()
    loss.backward()
    assert encoder[2].weight.grad is not None and encoder[2].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("change, message", [
    ({"activation_function": "my_package.Swish"}, "activation_function 'my_package.Swish' is not supported"),
    ({"in_features": "wide"}, "in_features must be an integer, got 'wide'"),
    ({"in_features": 100}, r"linear.weight is \(64, 384\); config.json says \(64, 100\)"),
    ({"bias": False}, "a Dense module's tensors are linear.weight; this file holds linear.bias, linear.weight"),
    ({"module_input_name": "token_embeddings"}, "module_input_name 'token_embeddings' is not supported"),
])
def test_a_dense_layer_that_does_not_fit_is_named_with_its_file(minilm_dir, tmp_path, change, message):
    dense_layout(tmp_path, minilm_dir, [{"in_features": 384, "out_features": 64}])
    config_path = tmp_path / "2_Dense" / "config.json"
    config_path.write_text(json.dumps(json.loads(config_path.read_text()) | change))
    with pytest.raises(BertforgeError, match=r"2_Dense/(config.json|model.safetensors): " + message):
        BertModel.from_pretrained(tmp_path)



@pytest.mark.parametrize("length, message", [
    ("x", "max_seq_length must be an integer, got 'x'"),  # was a ValueError out of int()
    (float("nan"), "max_seq_length must be an integer, got nan"),
    (2.5, "max_seq_length must be an integer, got 2.5"),  # was read as 2
    (0, "max_seq_length must be at least 1, got 0"),
])
def test_a_bad_max_seq_length_is_named_with_its_file(tmp_path, length, message):
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": length}))
    with pytest.raises(ConfigError, match=f"sentence_bert_config.json: {message}"):
        read_sentence_embedding(tmp_path)
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128.0}))
    assert read_sentence_embedding(tmp_path).max_length == 128


def test_serve_embed_follows_the_layout(long_texts, reference):
    """/embed (bertforge's and text-embeddings-inference's form) and /v1/embeddings with no options give
    sentence-transformers' vectors of the default model: its pooling, max_seq_length and normalisation."""
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app
    theirs = reference.encode(long_texts, convert_to_numpy=True)
    with TestClient(load_app("default")) as client:
        own = client.post("/embed", json={"texts": long_texts}).json()
        tei = client.post("/embed", json={"inputs": long_texts}).json()
        openai = client.post("/v1/embeddings", json={"input": long_texts}).json()
    assert own["pooling"] == "mean" and own["normalized"] is True
    for vectors in (own["embeddings"], tei, [item["embedding"] for item in openai["data"]]):
        assert cosines(np.asarray(vectors, dtype=np.float32), theirs).min() > 0.99999


@pytest.fixture(scope="module")
def prompted_dir(tmp_path_factory, minilm_dir):
    """The default model with prompts in its config_sentence_transformers.json, as instruction-tuned embedding
    models ship them."""
    import shutil

    directory = tmp_path_factory.mktemp("prompted")
    shutil.copytree(minilm_dir, directory, dirs_exist_ok=True)
    config_path = directory / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text())
    config["prompts"] = {"query": "query: ", "passage": "passage: "}
    config_path.write_text(json.dumps(config))
    return directory


def test_prompts_as_sentence_transformers_puts_them(prompted_dir, long_texts, tmp_path):
    reference = sentence_transformers.SentenceTransformer(str(prompted_dir), device="cpu")
    model, tokenizer = BertModel.from_pretrained(prompted_dir), BertTokenizer.from_pretrained(prompted_dir)
    texts = long_texts[-2:] + long_texts[:1]
    for options in ({"prompt_name": "query"}, {"prompt": "Represent this sentence: "}, {}):
        ours = extract_features(model, tokenizer, texts, **options).numpy()
        assert cosines(ours, reference.encode(texts, **options)).min() > 0.99999, options
    query, passage = (extract_features(model, tokenizer, texts[:1], prompt_name=name) for name in ("query", "passage"))
    assert float(query[0] @ passage[0]) < 0.999  # the prompt is read
    with pytest.raises(BertforgeError, match="prompt_name 'question': .* has prompts 'passage', 'query'"):
        extract_features(model, tokenizer, texts, prompt_name="question")

    # The command line, and a copy saved by bertforge, which sentence-transformers reads with its prompts.
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(prompted_dir), "--input", str(tmp_path / "texts.txt"), "--prompt-name",
                 "query", "--output", str(tmp_path / "v.npy")]) == 0
    assert cosines(np.load(tmp_path / "v.npy"), reference.encode(texts, prompt_name="query")).min() > 0.99999
    model.save_pretrained(tmp_path / "copy")
    tokenizer.save_pretrained(tmp_path / "copy")
    copy = sentence_transformers.SentenceTransformer(str(tmp_path / "copy"), device="cpu")
    assert cosines(copy.encode(texts, prompt_name="passage"), reference.encode(texts, prompt_name="passage")).min() \
        > 0.99999


def test_the_default_prompt_is_put_when_none_is_named(prompted_dir, long_texts, tmp_path):
    import shutil

    shutil.copytree(prompted_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config_sentence_transformers.json").read_text())
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({**config,
                                                                            "default_prompt_name": "passage"}))
    reference = sentence_transformers.SentenceTransformer(str(tmp_path), device="cpu")
    ours = extract_features(BertModel.from_pretrained(tmp_path), BertTokenizer.from_pretrained(tmp_path),
                            long_texts[-2:])
    assert cosines(ours.numpy(), reference.encode(long_texts[-2:])).min() > 0.99999
    assert cosines(ours.numpy(), reference.encode(long_texts[-2:], prompt_name="passage")).min() > 0.99999
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({**config,
                                                                            "default_prompt_name": "nope"}))
    with pytest.raises(ConfigError, match="config_sentence_transformers.json: default_prompt_name 'nope' is not"):
        read_sentence_embedding(tmp_path)


@pytest.fixture(scope="module")
def pooled_texts(long_texts, data_dir):
    """Texts of every length: real sentences, two paragraphs longer than the layouts' max_seq_length, one word."""
    sentences = [line.split("\t")[0] for line in (data_dir / "sst2" / "dev.tsv").read_text().splitlines()[1:9]]
    return sentences + long_texts[:2] + ["Short."]


@pytest.mark.parametrize("mode", ["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"])
@pytest.mark.parametrize("include_prompt", [True, False])
def test_every_pooling_mode_pools_as_sentence_transformers(mode, include_prompt, minilm_dir, pooled_texts, tmp_path):
    """A layout sentence-transformers wrote with each of its pooling modes, with and without the prompt's tokens
    (include_prompt false: [CLS] and the prompt are left out), through the API, the command line and the server."""
    from fastapi.testclient import TestClient

    from bertforge import SentenceEncoder
    from bertforge.inference.serve.app import load_app
    transformer = st_modules.Transformer(str(minilm_dir), max_seq_length=128)
    pooling = st_modules.Pooling(transformer.get_embedding_dimension(), pooling_mode=mode,
                                 include_prompt=include_prompt)
    sentence_transformers.SentenceTransformer(modules=[transformer, pooling], device="cpu",
                                              prompts={"query": "query: ", "long": "Represent this review: "}
                                              ).save(str(tmp_path))
    reference = sentence_transformers.SentenceTransformer(str(tmp_path), device="cpu")
    encoder = SentenceEncoder(tmp_path)
    for options in ({}, {"prompt_name": "query"}, {"prompt_name": "long"}, {"prompt": "Say: "}):
        theirs, ours = reference.encode(pooled_texts, **options), encoder.encode(pooled_texts, **options)
        assert cosines(ours, theirs).min() > 0.99999, options
        assert np.abs(ours - theirs).max() < 1e-4, options
    theirs = reference.encode(pooled_texts, prompt_name="long")
    (tmp_path / "texts.txt").write_text("\n".join(pooled_texts) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(tmp_path), "--input", str(tmp_path / "texts.txt"), "--prompt-name", "long",
                 "--output", str(tmp_path / "v.npy")]) == 0
    assert cosines(np.load(tmp_path / "v.npy"), theirs).min() > 0.99999
    with TestClient(load_app(tmp_path)) as client:
        served = client.post("/embed", json={"inputs": pooled_texts, "prompt_name": "long", "normalize": False})
    assert cosines(np.asarray(served.json(), dtype=np.float32), theirs).min() > 0.99999
    if not include_prompt and mode != "lasttoken":  # the last token ([SEP]) is pooled either way
        with_prompt = SentenceEncoder(tmp_path)
        with_prompt._change(include_prompt=True)
        assert cosines(with_prompt.encode(pooled_texts, prompt_name="long"), theirs).min() < 0.999


def test_serve_puts_the_prompt_named(prompted_dir, long_texts):
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app
    reference = sentence_transformers.SentenceTransformer(str(prompted_dir), device="cpu")
    theirs = reference.encode(long_texts[-2:], prompt_name="query")
    with TestClient(load_app(prompted_dir)) as client:
        tei = client.post("/embed", json={"inputs": long_texts[-2:], "prompt_name": "query"}).json()
        similarity = client.post("/similarity", json={"inputs": {"source_sentence": long_texts[-2],
                                                                 "sentences": long_texts[-1:]},
                                                      "parameters": {"prompt_name": "query"}}).json()
        unknown = client.post("/embed", json={"inputs": "x", "prompt_name": "question"})
        tokens = client.post("/tokenize", json={"inputs": long_texts[-2:], "prompt_name": "query"}).json()
        (plain,) = client.post("/tokenize", json={"inputs": long_texts[-1], "add_special_tokens": False}).json()
        refused = [client.post("/tokenize", json=body) for body in ({"inputs": "x", "prompt_name": "question"},
                                                                   {"text": "x", "prompt_name": "query"})]
    assert cosines(np.asarray(tei, dtype=np.float32), theirs).min() > 0.99999
    # TEI tokenizes the text after the prompt, and its tokens' offsets count from the prompt's first character
    for text, row in zip(long_texts[-2:], tokens):
        assert [token["id"] for token in row] == reference.tokenizer("query: " + text)["input_ids"]
        assert row[1]["text"] == "query" and row[1]["start"] == 0
        assert all(token["text"] == ("query: " + text)[token["start"]:token["stop"]] for token in row[1:-1])
    assert [token["id"] for token in plain] == reference.tokenizer(long_texts[-1], add_special_tokens=False,
                                                                   truncation=False)["input_ids"]
    assert [(r.status_code, r.json()["error"]) for r in refused] == \
        [(422, "prompt_name 'question': the model's sentence-transformers configuration has prompts 'passage', "
               "'query'"), (422, '"prompt_name" goes with "inputs", not "text"')]
    assert similarity == pytest.approx([float(theirs[0] @ theirs[1])], abs=1e-5)
    assert unknown.status_code == 422 and "has prompts 'passage', 'query'" in unknown.json()["error"]


def test_openai_input_type_puts_the_role_prompt(prompted_dir, long_texts):
    """/v1/embeddings' input_type (Jina's role field; PyLate's is_query) puts the prompt that sentence-transformers'
    encode_query / encode_document put ("query: " here; the document prompt, which sentence-transformers makes
    empty where the checkpoint has none, before "passage"); without it, none, as encode."""
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app
    reference = sentence_transformers.SentenceTransformer(str(prompted_dir), device="cpu")
    texts = long_texts[-3:]
    expected = {"query": reference.encode_query(texts), "document": reference.encode_document(texts),
                None: reference.encode(texts)}
    assert cosines(expected["query"], expected[None]).max() < 0.9999  # the "query: " prompt changes them
    with TestClient(load_app(prompted_dir)) as client:
        for body, role in (({"input_type": "query"}, "query"), ({"is_query": True}, "query"),
                           ({"input_type": "document"}, "document"), ({"is_query": False}, "document"), ({}, None)):
            answer = client.post("/v1/embeddings", json={"input": texts, **body}).json()
            served = np.asarray([item["embedding"] for item in answer["data"]], dtype=np.float32)
            assert cosines(served, expected[role]).min() > 0.99999, body


def test_sentence_encoder_answers_as_sentence_transformer(long_texts, reference, prompted_dir):
    """Code written against SentenceTransformer runs on SentenceEncoder with the same vectors and shapes."""
    from bertforge import SentenceEncoder

    ours = SentenceEncoder.from_pretrained("default")
    texts = long_texts[-2:] + long_texts[:1]
    assert ours.encode(texts).shape == reference.encode(texts).shape == (3, 384)
    assert cosines(ours.encode(texts), reference.encode(texts)).min() > 0.99999
    single, theirs_single = ours.encode(texts[0]), reference.encode(texts[0])
    assert single.shape == theirs_single.shape == (384,) and single.dtype == theirs_single.dtype == np.float32
    as_tensor = ours.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.shape == (3, 384)
    torch.testing.assert_close(ours.similarity(as_tensor, as_tensor[:2]),
                               reference.similarity(reference.encode(texts), reference.encode(texts[:2])),
                               atol=1e-5, rtol=0)
    assert ours.get_sentence_embedding_dimension() == reference.get_embedding_dimension()
    assert ours.max_seq_length == reference.max_seq_length == 256
    prompted, prompted_reference = SentenceEncoder.from_pretrained(prompted_dir), \
        sentence_transformers.SentenceTransformer(str(prompted_dir), device="cpu")
    for name in ("query", "passage"):
        assert cosines(prompted.encode(texts, prompt_name=name),
                       prompted_reference.encode(texts, prompt_name=name)).min() > 0.99999
    assert cosines(prompted.encode_query(texts), prompted_reference.encode(texts, prompt_name="query")).min() \
        > 0.99999
    # sentence-transformers 5 gives every model an empty "document" prompt, which encode_document takes first
    assert cosines(prompted.encode_document(texts), prompted_reference.encode_document(texts)).min() > 0.99999
    assert cosines(prompted.encode(texts, prompt_name="document"), prompted_reference.encode(texts)).min() > 0.99999


def test_sentence_encoder_options_as_sentence_transformer(long_texts, minilm_dir):
    """encode's other options, the similarity functions and a shorter max_seq_length, against SentenceTransformer
    on the default model (its own copy: the test changes its settings)."""
    from bertforge import SentenceEncoder
    from bertforge.errors import InputError

    reference = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    ours = SentenceEncoder.from_pretrained("default")
    texts = long_texts[-3:] + ["A man is eating food.", "x"]
    for options in ({"truncate_dim": 32}, {"truncate_dim": 32, "normalize_embeddings": True}):
        mine, theirs = ours.encode(texts, **options), reference.encode(texts, **options)
        assert mine.shape == theirs.shape == (5, 32)
        np.testing.assert_allclose(mine, theirs, atol=2e-6, rtol=0)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        mine, theirs = ours.encode(texts, precision=precision), reference.encode(texts, precision=precision)
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
        # The same scale. A value on a step's edge lands on either side of it with float32 noise, and the values
        # that set a dimension's range are on one (255 * (high - low) / (high - low): 254.99998 or 255): 2 in 5
        # here (measured: 0.989-0.99+ equal; a scale of its own would be off by many steps).
        difference = np.abs(mine.astype(np.int32) - theirs.astype(np.int32))
        assert difference.max() <= 1 and (difference == 0).mean() > 0.97
    mine, theirs = ours.encode(texts, output_value="token_embeddings"), \
        reference.encode(texts, output_value="token_embeddings")
    assert [m.shape for m in mine] == [t.shape for t in theirs]
    assert max(float((m - t).abs().max()) for m, t in zip(mine, theirs)) < 1e-4
    for precision in ("int8", "binary"):  # every token of the call in one range, each text's a numpy array
        mine, theirs = ours.encode(texts, output_value="token_embeddings", precision=precision), \
            reference.encode(texts, output_value="token_embeddings", precision=precision)
        assert [(m.shape, m.dtype, type(m)) for m in mine] == [(t.shape, t.dtype, type(t)) for t in theirs]
        difference = np.abs(np.concatenate(mine).astype(np.int32) - np.concatenate(theirs).astype(np.int32))
        assert difference.max() <= 1 and (difference == 0).mean() > 0.97
    everything = ours.encode(texts[:2], output_value=None)
    assert list(everything[0]) == list(reference.encode(texts[:2], output_value=None)[0])
    assert everything[1]["token_embeddings"].shape[0] == len(everything[1]["input_ids"])
    prompted = ours.encode(texts[:2], output_value=None, prompt="query: ")[0]
    described = reference.encode(texts[:2], output_value=None, prompt="query: ")[0]
    assert list(prompted) == list(described) and prompted["prompt_length"] == described["prompt_length"] == 3
    with pytest.raises(InputError, match="precision 'int8' quantizes sentence or token embeddings"):
        ours.encode(texts, output_value=None, precision="int8")
    # shapes of one text and of none, as sentence-transformers gives them
    single = ours.encode(texts[0], convert_to_numpy=False)
    assert isinstance(single, torch.Tensor) and single.shape == (384,)
    assert ours.encode([]).shape == reference.encode([]).shape
    assert ours.encode([], convert_to_tensor=True).shape == reference.encode([], convert_to_tensor=True).shape
    assert ours.encode(texts[:2], convert_to_numpy=False)[1].shape == (384,)
    vectors = reference.encode(texts)
    for name in ("cosine", "dot", "euclidean", "manhattan"):
        ours.similarity_fn_name, reference.similarity_fn_name = name, name
        torch.testing.assert_close(ours.similarity(vectors, vectors[:2]), reference.similarity(vectors, vectors[:2]))
        torch.testing.assert_close(ours.similarity_pairwise(vectors, vectors[::-1].copy()),
                                   reference.similarity_pairwise(vectors, vectors[::-1].copy()))
    ours.max_seq_length, reference.max_seq_length = 12, 12
    assert cosines(ours.encode(texts), reference.encode(texts)).min() > 0.99999
    assert ours.encode(texts[0], output_value="token_embeddings").shape == (12, 384)
    with pytest.raises(InputError, match="got NoneType"):
        ours.encode(None)
    with pytest.raises(InputError, match="prompt_name 'nope': the model has prompts 'document', 'query'"):
        ours.encode("x", prompt_name="nope")
    with pytest.raises(InputError, match="unknown similarity_fn_name 'cos'"):
        ours.similarity_fn_name = "cos"
    with pytest.raises(InputError, match="max_seq_length must be"):
        ours.max_seq_length = 1000


def test_the_similarity_function_named_is_read_and_saved(minilm_dir, tmp_path):
    import shutil

    from bertforge import SentenceEncoder

    shutil.copytree(minilm_dir, tmp_path / "dot")
    config_path = tmp_path / "dot" / "config_sentence_transformers.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "similarity_fn_name": "dot"}))
    ours = SentenceEncoder.from_pretrained(tmp_path / "dot")
    reference = sentence_transformers.SentenceTransformer(str(tmp_path / "dot"), device="cpu")
    assert ours.similarity_fn_name == reference.similarity_fn_name == "dot"
    ours.model.save_pretrained(tmp_path / "copy")
    ours.tokenizer.save_pretrained(tmp_path / "copy")
    assert sentence_transformers.SentenceTransformer(str(tmp_path / "copy"), device="cpu").similarity_fn_name == "dot"


def test_sentence_encoder_is_made_saved_and_called_as_sentence_transformer(long_texts, prompted_dir, tmp_path):
    """SentenceTransformer(path, prompts=..., truncate_dim=..., similarity_fn_name=...), save(), tokenize() and
    calling the model on tokenize's features, against sentence-transformers on the same folder."""
    from bertforge import SentenceEncoder

    texts = long_texts[-2:] + long_texts[:1]
    options = {"device": "cpu", "prompts": {"query": "Represent this question: ", "short": "s: "},
               "default_prompt_name": "short", "truncate_dim": 128, "similarity_fn_name": "dot"}
    ours = SentenceEncoder(str(prompted_dir), **options, local_files_only=True, tokenizer_kwargs={})
    theirs = sentence_transformers.SentenceTransformer(str(prompted_dir), **options)
    assert ours.prompts == theirs.prompts and ours.default_prompt_name == theirs.default_prompt_name
    assert ours.get_embedding_dimension() == theirs.get_embedding_dimension() == 128
    assert ours.SUPPORTED_SIMILARITY_FN_NAMES == theirs.SUPPORTED_SIMILARITY_FN_NAMES
    with ours.truncate_embeddings(16), theirs.truncate_embeddings(16):
        assert ours.encode(texts).shape == theirs.encode(texts).shape == (3, 16)
    assert ours.encode(texts).shape == (3, 128)
    assert (ours.get_backend(), ours.dtype) == (theirs.get_backend(), theirs.dtype)
    for call in ("encode", "encode_query", "encode_document"):
        mine, reference = getattr(ours, call)(texts), getattr(theirs, call)(texts)
        assert mine.shape == reference.shape == (3, 128)
        assert cosines(mine, reference).min() > 0.99999
    torch.testing.assert_close(ours.similarity(mine, mine), theirs.similarity(reference, reference),
                               atol=1e-3, rtol=1e-5)

    features, reference_features = ours.tokenize(texts), theirs.tokenize(texts)
    assert torch.equal(features["input_ids"], reference_features["input_ids"])
    # preprocess, sentence-transformers 6's name for it, puts a prompt before each (first) text
    for inputs in (texts, [(texts[0], texts[1]), (texts[2], "x")]):
        for prompt in (None, "Represent this question: "):
            mine, reference = ours.preprocess(inputs, prompt=prompt), theirs.preprocess(inputs, prompt=prompt)
            for name in ("input_ids", "token_type_ids", "attention_mask"):
                assert torch.equal(mine[name], reference[name]), (name, prompt)
    assert ours.preprocess([]) == theirs.preprocess([]) == {}
    pairs = [(texts[0], texts[1]), (texts[2], "x")]
    assert torch.equal(ours.tokenize(pairs)["token_type_ids"], theirs.tokenize(pairs)["token_type_ids"])
    with torch.inference_mode():
        expected = theirs(reference_features)
    got = ours(features)
    torch.testing.assert_close(got["sentence_embedding"], expected["sentence_embedding"], atol=2e-5, rtol=0)
    real = features["attention_mask"].bool()
    torch.testing.assert_close(got["token_embeddings"][real], expected["token_embeddings"][real], atol=2e-5, rtol=0)

    ours.max_seq_length, ours.similarity_fn_name = 64, "manhattan"
    ours.save(str(tmp_path / "saved"))
    loaded = sentence_transformers.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert (loaded.max_seq_length, loaded.similarity_fn_name) == (64, "manhattan")
    assert loaded.prompts == ours.prompts and loaded.default_prompt_name == "short"
    assert loaded.truncate_dim == SentenceEncoder(tmp_path / "saved").truncate_dim == 128  # saved, as there
    mine = SentenceEncoder(tmp_path / "saved").encode(texts)
    assert mine.shape == (3, 128) and cosines(mine, loaded.encode(texts)).min() > 0.99999
    assert cosines(mine, ours.encode(texts)).min() > 0.99999


def test_sentence_encoder_settings_are_set_saved_and_compared_as_sentence_transformer(long_texts, minilm_dir,
                                                                                     tmp_path):
    """What sentence-transformers' own tests do with a model's settings: prompts and default_prompt_name
    assigned, "query" as the default prompt of a model without prompts, a truncate_dim it saved, similarity's
    keywords and a pair of single vectors, tokenize's features."""
    from bertforge import SentenceEncoder

    texts = long_texts[:3]
    ours, theirs = SentenceEncoder(minilm_dir), sentence_transformers.SentenceTransformer(str(minilm_dir))
    for model in (ours, theirs):
        model.prompts = {"query": "query: ", "passage": "passage: "}
        model.default_prompt_name = "passage"
    assert ours.default_prompt_name == theirs.default_prompt_name == "passage"
    for call in ({}, {"prompt_name": "query"}, {"prompt_name": None}):
        assert cosines(ours.encode(texts, **call), theirs.encode(texts, **call)).min() > 0.99999, call
    assert cosines(ours.encode(texts), ours.encode(texts, prompt="passage: ")).min() > 0.99999
    ours.default_prompt_name = None
    assert cosines(ours.encode(texts), theirs.encode(texts, prompt="")).min() > 0.99999
    with pytest.raises(ConfigError, match="default_prompt_name 'nope' is none of the prompts"):
        ours.default_prompt_name = "nope"
    with pytest.raises(ConfigError, match="prompts must be a dict of prompt names to texts"):
        ours.prompts = {"query": 1}

    shorter = {"tokenizer_kwargs": {"model_max_length": 64}}
    assert SentenceEncoder(minilm_dir, **shorter).max_seq_length == \
        sentence_transformers.SentenceTransformer(str(minilm_dir), **shorter).max_seq_length == 64

    # every model has an empty "query" prompt, so naming it the default changes nothing
    plain = SentenceEncoder(minilm_dir, default_prompt_name="query")
    reference = sentence_transformers.SentenceTransformer(str(minilm_dir), default_prompt_name="query")
    assert cosines(plain.encode(texts), reference.encode(texts)).min() > 0.99999

    sentence_transformers.SentenceTransformer(str(minilm_dir), truncate_dim=64).save(str(tmp_path / "matryoshka"))
    assert SentenceEncoder(tmp_path / "matryoshka").encode(texts).shape == (3, 64)
    assert SentenceEncoder(tmp_path / "matryoshka", truncate_dim=32).encode(texts).shape == (3, 32)

    vectors = theirs.encode(texts)
    torch.testing.assert_close(ours.similarity(embeddings1=vectors, embeddings2=vectors[:1]),
                               theirs.similarity(embeddings1=vectors, embeddings2=vectors[:1]))
    for name in ("cosine", "dot", "euclidean", "manhattan"):
        ours.similarity_fn_name, theirs.similarity_fn_name = name, name
        mine, reference = ours.similarity_pairwise(vectors[0], vectors[1]), \
            theirs.similarity_pairwise(vectors[0], vectors[1])
        assert mine.shape == reference.shape == ()
        torch.testing.assert_close(mine, reference)
    ours.similarity_fn_name, theirs.similarity_fn_name = None, None  # the default again
    assert ours.similarity_fn_name == theirs.similarity_fn_name == "cosine"

    # Prompts given to the constructor join the empty role prompts every model has; assigned, they replace them,
    # so encode_document takes "passage", then "corpus", where no "document" prompt is left.
    ours, theirs = (SentenceEncoder(minilm_dir, prompts={"passage": "passage: "}),
                    sentence_transformers.SentenceTransformer(str(minilm_dir), prompts={"passage": "passage: "}))
    assert ours.prompts == theirs.prompts == {"query": "", "document": "", "passage": "passage: "}
    for prompts in ({"passage": "passage: ", "corpus": "corpus: "}, {"corpus": "corpus: "}):
        ours.prompts, theirs.prompts = dict(prompts), dict(prompts)
        assert ours.prompts == theirs.prompts == prompts
        for call in ("encode_document", "encode_query"):
            mine, reference = getattr(ours, call)(texts), getattr(theirs, call)(texts)
            assert cosines(mine, reference).min() > 0.99999, (prompts, call)
        assert cosines(ours.encode_document(texts), ours.encode(texts, prompt=prompts.get("passage", "corpus: "))
                       ).min() > 0.99999
    ours.save(str(tmp_path / "prompted"))
    theirs.save(str(tmp_path / "theirs"))
    assert json.loads((tmp_path / "prompted" / "config_sentence_transformers.json").read_text())["prompts"] == \
        json.loads((tmp_path / "theirs" / "config_sentence_transformers.json").read_text())["prompts"]
    plain = SentenceEncoder(minilm_dir)
    plain.save(str(tmp_path / "plain"))
    assert json.loads((tmp_path / "plain" / "config_sentence_transformers.json").read_text())["prompts"] == \
        {"query": "", "document": ""}  # as sentence-transformers saves a model without prompts

    for inputs in ({"text": texts[0]}, [{"text": text} for text in texts]):  # sentence-transformers 6's by modality
        mine, reference = ours.encode(inputs, prompt=""), theirs.encode(inputs, prompt="")
        assert cosines(np.atleast_2d(mine), np.atleast_2d(reference)).min() > 0.99999

    features, reference_features = ours.tokenize(texts), theirs.tokenize(texts)
    assert list(features) == list(reference_features) and features["modality"] == "text"
    assert torch.equal(features.to("cpu")["input_ids"], reference_features["input_ids"])
    assert ours.tokenize([]) == theirs.tokenize([]) == {}
    assert list(ours(features)) == list(theirs(reference_features))


def test_sentence_encoder_reads_text_pairs_as_sentence_transformer(long_texts, minilm_dir):
    """(text, pair) inputs, alone or among texts: one input [CLS] text [SEP] pair [SEP] with its token types, the
    prompt before the first text, a long pair cut longer side first; against SentenceTransformer.encode."""
    from bertforge import SentenceEncoder
    from bertforge.errors import InputError

    reference = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    ours = SentenceEncoder.from_pretrained("default")
    inputs = [(long_texts[-2], long_texts[-1]), [long_texts[0], long_texts[1]], long_texts[2],
              ("A man is eating food.", long_texts[3]), ("", "x")]
    for options in ({}, {"prompt": "query: "}, {"normalize_embeddings": True, "batch_size": 2}):
        mine, theirs = ours.encode(inputs, **options), reference.encode(inputs, **options)
        assert mine.shape == theirs.shape == (5, 384)
        np.testing.assert_allclose(mine, theirs, atol=2e-6, rtol=0)
    mine, theirs = ours.encode(inputs, output_value="token_embeddings"), \
        reference.encode(inputs, output_value="token_embeddings")
    assert [m.shape for m in mine] == [t.shape for t in theirs] and mine[1].shape == (256, 384)
    assert max(float((m - t).abs().max()) for m, t in zip(mine, theirs)) < 1e-4
    for row, described in zip(ours.encode(inputs, output_value=None, prompt="query: "),
                               reference.encode(inputs, output_value=None, prompt="query: ")):
        real = len(row["input_ids"])  # sentence-transformers pads each row to its batch's longest
        assert list(row) == list(described) and row["prompt_length"] == described["prompt_length"]
        assert row["token_type_ids"].tolist() == described["token_type_ids"][:real].tolist()
        assert described["attention_mask"][real:].sum() == 0
    ours.max_seq_length, reference.max_seq_length = 40, 40
    np.testing.assert_allclose(ours.encode(inputs), reference.encode(inputs), atol=2e-6, rtol=0)
    with pytest.raises(InputError, match=r"a \(text, pair\) of two texts, got a tuple of \(str, str, str\)"):
        ours.encode([("a", "b", "c")])
    with pytest.raises(InputError, match=r"got a list of \(str, int\)"):
        ours.encode(["a", ["b", 3]])


def test_sentence_encoder_refuses_what_it_cannot_be_as_one_line_errors(minilm):
    from bertforge import SentenceEncoder

    with pytest.raises(ConfigError, match="backend 'openvino': SentenceEncoder runs 'torch' or 'onnx'"):
        SentenceEncoder("default", backend="openvino")
    with pytest.raises(ConfigError, match="^device 'gpu' is not a device; use cpu, cuda, cuda:N or mps$"):
        SentenceEncoder("default", device="gpu")  # named as given (loading calls it device_map)
    with pytest.raises(ConfigError, match="a loaded model needs its tokenizer"):
        SentenceEncoder(minilm)
    with pytest.raises(ConfigError, match="default_prompt_name 'query2' is none of the prompts"):
        SentenceEncoder("default", default_prompt_name="query2")
    with pytest.raises(ConfigError, match="SentenceEncoder takes no option 'batch_size'"):
        SentenceEncoder("default", batch_size=4)


@pytest.fixture(scope="module")
def evaluators(data_dir, squad_contexts):
    """sentence-transformers' evaluators on real data: STS-B (and its int8 embeddings), MRPC, SQuAD retrieval,
    triplets from MRPC (a sentence, its paraphrase, another row's paraphrase)."""
    import csv

    evaluation = importlib.import_module("sentence_transformers.evaluation")

    def rows(task, name):
        with open(data_dir / task / name, encoding="utf-8-sig") as handle:
            return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:120]

    stsb, mrpc = rows("stsb", "dev.tsv"), rows("mrpc", "dev.tsv")
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = [paragraph for article in squad["data"] for paragraph in article["paragraphs"]][:40]
    queries = {f"q{i}": paragraph["qas"][0]["question"] for i, paragraph in enumerate(paragraphs)}
    corpus = {f"p{i}": paragraph["context"] for i, paragraph in enumerate(paragraphs)}
    paraphrases = [row for row in mrpc if row["Quality"] == "1"]
    return {
        "sts": evaluation.EmbeddingSimilarityEvaluator([r["sentence1"] for r in stsb], [r["sentence2"] for r in stsb],
                                                       [float(r["score"]) / 5 for r in stsb], name="stsb"),
        "sts int8": evaluation.EmbeddingSimilarityEvaluator(
            [r["sentence1"] for r in stsb], [r["sentence2"] for r in stsb], [float(r["score"]) / 5 for r in stsb],
            name="stsb-int8", precision="int8"),
        "pairs": evaluation.BinaryClassificationEvaluator([r["#1 String"] for r in mrpc],
                                                          [r["#2 String"] for r in mrpc],
                                                          [int(r["Quality"]) for r in mrpc], name="mrpc"),
        "retrieval": evaluation.InformationRetrievalEvaluator(queries, corpus, {f"q{i}": {f"p{i}"} for i in
                                                                                  range(len(paragraphs))},
                                                              name="squad"),
        "triplets": evaluation.TripletEvaluator([r["#1 String"] for r in paraphrases],
                                                [r["#2 String"] for r in paraphrases],
                                                [r["#2 String"] for r in paraphrases[1:] + paraphrases[:1]],
                                                name="mrpc-triplets"),
    }


@pytest.mark.parametrize("kind", ["sts", "sts int8", "pairs", "retrieval", "triplets"])
def test_sentence_transformers_evaluators_score_the_encoder_as_sentence_transformer(kind, evaluators, minilm_dir,
                                                                                   reference):
    """An evaluator written for SentenceTransformer runs on SentenceEncoder (it passes precision=None, records its
    metrics on model_card_data) and scores it as SentenceTransformer on the same checkpoint."""
    from bertforge import SentenceEncoder

    encoder = SentenceEncoder(minilm_dir)
    evaluator = evaluators[kind]
    ours, theirs = encoder.evaluate(evaluator), reference.evaluate(evaluator)
    assert ours.keys() == theirs.keys() and len(ours) >= 1
    for metric, value in theirs.items():
        # A threshold is one pair's similarity, and an int8 code at a step's edge can differ by one: float32
        # rounding shows there; elsewhere it averages out.
        rounding_shows = metric.endswith("threshold") or "int8" in kind
        assert ours[metric] == pytest.approx(value, abs=1e-5 if rounding_shows else 1e-6), metric
    assert encoder.model_card_data.eval_results_dict[evaluator] == ours


def test_sentence_transformers_losses_train_the_encoder_as_sentence_transformer(minilm_dir, data_dir):
    """SentenceEncoder is a module, as SentenceTransformer is: a sentence-transformers loss (in-batch negatives on
    MRPC paraphrases) trains it through forward with SentenceTransformer's losses step by step (dropout off in
    both, so that the two draw nothing), and encode afterwards runs in eval mode as sentence-transformers' does."""
    import csv

    from bertforge import SentenceEncoder

    losses_module = importlib.import_module("sentence_transformers.losses")
    with open(data_dir / "mrpc" / "train.tsv", encoding="utf-8-sig") as handle:
        pairs = [(row["#1 String"], row["#2 String"]) for row in csv.DictReader(handle, delimiter="\t",
                                                                                quoting=csv.QUOTE_NONE)
                 if row["Quality"] == "1"][:48]
    ours = SentenceEncoder(minilm_dir)
    theirs = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    steps = {}
    for name, model in (("ours", ours), ("theirs", theirs)):
        loss = losses_module.MultipleNegativesRankingLoss(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model.eval()  # gradients flow; dropout is off
        steps[name] = []
        for start in range(0, len(pairs), 16):
            batch = pairs[start:start + 16]
            features = [model.tokenize([first for first, _ in batch]), model.tokenize([second for _, second in batch])]
            optimizer.zero_grad()
            value = loss(features, torch.arange(len(batch)))
            value.backward()
            optimizer.step()
            steps[name].append(value.item())
    assert steps["ours"][-1] < steps["ours"][0]
    torch.testing.assert_close(torch.tensor(steps["ours"]), torch.tensor(steps["theirs"]), atol=1e-4, rtol=0)

    ours.train()
    texts = [first for first, _ in pairs[:4]]
    vectors = ours.encode(texts)
    assert not ours.training
    assert cosines(vectors, theirs.encode(texts)).min() > 0.9999


def stsb_examples(data_dir) -> tuple[list[dict], list]:
    """The first 64 STS-B training pairs, and each as sentence-transformers' InputExample with its score / 5."""
    import csv

    with open(data_dir / "stsb" / "train.tsv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:64]
    return rows, [sentence_transformers.InputExample(texts=[row["sentence1"], row["sentence2"]],
                                                     label=float(row["score"]) / 5) for row in rows]


def test_fit_trains_as_sentence_transformers_fit(minilm_dir, data_dir, tmp_path):
    """fit, as in sentence-transformers' tutorials (InputExample's in a DataLoader, CosineSimilarityLoss on STS-B
    pairs), moves the weights as sentence-transformers' own loop (old_fit) does on the same examples and schedule
    (dropout off in both); with an evaluator and output_path it keeps the best model, which sentence-transformers
    loads with the vectors it gives."""
    from torch.utils.data import DataLoader

    from bertforge import SentenceEncoder

    losses_module = importlib.import_module("sentence_transformers.losses")
    evaluation = importlib.import_module("sentence_transformers.evaluation")
    rows, examples = stsb_examples(data_dir)
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    ours = SentenceEncoder(minilm_dir, config_kwargs=no_dropout)
    theirs = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu", config_kwargs=no_dropout)
    texts = [row["sentence1"] for row in rows[:8]]
    before = ours.encode(texts)
    settings = dict(epochs=1, warmup_steps=2, weight_decay=0.0, optimizer_params={"lr": 5e-5},
                    show_progress_bar=False)
    ours.fit([(DataLoader(examples, batch_size=16), losses_module.CosineSimilarityLoss(ours))], **settings)
    theirs.old_fit([(DataLoader(examples, batch_size=16), losses_module.CosineSimilarityLoss(theirs))], **settings)
    after = ours.encode(texts)
    assert np.abs(after - before).max() > 0.01  # it trained
    np.testing.assert_allclose(after, theirs.encode(texts), atol=1e-5)

    evaluator = evaluation.EmbeddingSimilarityEvaluator([row["sentence1"] for row in rows[:32]],
                                                        [row["sentence2"] for row in rows[:32]],
                                                        [float(row["score"]) / 5 for row in rows[:32]], name="sts")
    ours.fit([(DataLoader(examples, batch_size=16), losses_module.CosineSimilarityLoss(ours))], evaluator=evaluator,
             evaluation_steps=2, output_path=tmp_path / "best", **settings)
    assert "sts_spearman_cosine" in ours.model_card_data.eval_results_dict[evaluator]
    saved = sentence_transformers.SentenceTransformer(str(tmp_path / "best"), device="cpu")
    assert cosines(saved.encode(texts), SentenceEncoder(tmp_path / "best").encode(texts)).min() > 0.99999
    with pytest.raises(ConfigError, match="fit: scheduler is not supported here"):
        ours.fit([(DataLoader(examples), losses_module.CosineSimilarityLoss(ours))],
                 scheduler="WarmupCosineWithHardRestarts")


@pytest.mark.parametrize("scheduler", ["WarmupCosine", "ConstantLR"])
def test_fits_other_schedules_move_the_weights_as_sentence_transformers(scheduler, minilm_dir, data_dir):
    """fit's scheduler= (WarmupCosine; ConstantLR, which ignores warmup_steps) moves the weights as
    sentence-transformers' old_fit does with the same schedule (with one warm-up step of four, each schedule moves
    them apart from WarmupLinear's by more than 1e-4, ten times the tolerance)."""
    from torch.utils.data import DataLoader

    from bertforge import SentenceEncoder

    losses_module = importlib.import_module("sentence_transformers.losses")
    rows, examples = stsb_examples(data_dir)
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    texts = [row["sentence1"] for row in rows[:8]]
    settings = dict(epochs=1, warmup_steps=1, weight_decay=0.0, optimizer_params={"lr": 5e-5},
                    show_progress_bar=False)  # 4 steps: the schedules differ after the first
    vectors = {}
    for name, make in (("ours", lambda: SentenceEncoder(minilm_dir, config_kwargs=no_dropout)),
                       ("theirs", lambda: sentence_transformers.SentenceTransformer(
                           str(minilm_dir), device="cpu", config_kwargs=no_dropout))):
        model = make()
        fit = model.old_fit if name == "theirs" else model.fit
        fit([(DataLoader(examples, batch_size=16), losses_module.CosineSimilarityLoss(model))], scheduler=scheduler,
            **settings)
        vectors[name] = model.encode(texts)
    np.testing.assert_allclose(vectors["ours"], vectors["theirs"], atol=1e-5)


def test_the_encoder_is_indexed_as_sentence_transformers_modules(long_texts, minilm_dir):
    """model[0].auto_model / .tokenizer / .max_seq_length, model[1].pooling_mode and the flags before 6, len(model):
    what sentence-transformers' module list answers; max_seq_length set through model[0] cuts as it cuts; a model
    wrapped in LoRA adapters through model[0].auto_model (peft, as its recipes for sentence-transformers do) encodes
    as sentence-transformers' wrapped the same way; a numpy column of texts encodes as a list."""
    from bertforge import SentenceEncoder

    peft = pytest.importorskip("peft")
    ours = SentenceEncoder(minilm_dir)
    theirs = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    assert len(ours) == len(theirs) == 3
    assert [type(module).__name__ for module in ours] == [type(module).__name__ for module in theirs]
    assert ours._first_module().max_seq_length == theirs[0].max_seq_length == 256
    assert type(ours[0].auto_model).__name__ == type(theirs[0].auto_model).__name__ == "BertModel"
    assert ours[0].tokenizer("A man is playing a guitar.")["input_ids"] == theirs[0].tokenizer(
        "A man is playing a guitar.")["input_ids"]
    assert ours[0].get_embedding_dimension() == theirs[0].get_embedding_dimension() == 384
    assert (ours[1].pooling_mode, ours[1].include_prompt) == (theirs[1].pooling_mode, theirs[1].include_prompt)
    assert ours[-1] is not None and ours[1].get_embedding_dimension() == theirs[1].get_embedding_dimension()
    assert ours[1].pooling_mode_mean_tokens and not ours[1].pooling_mode_cls_token
    ours[0].max_seq_length = theirs[0].max_seq_length = 32
    assert ours.max_seq_length == 32
    assert cosines(ours.encode(long_texts), theirs.encode(long_texts)).min() > 0.99999

    texts = np.array(long_texts)
    for model in (ours, theirs):
        settings = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False)
        torch.manual_seed(0)  # the same random adapters for both (init_lora_weights=False: B is not zero)
        model[0].auto_model = peft.get_peft_model(model[0].auto_model, settings)
    wrapped, reference = ours.encode(texts), theirs.encode(texts)
    assert cosines(wrapped, reference).min() > 0.99999
    assert cosines(wrapped, SentenceEncoder(minilm_dir).encode(list(texts))).min() < 0.999  # the adapters act
    trainable = [name for name, parameter in ours.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


@pytest.mark.parametrize("variant", ["plain", "gradient checkpointing", "matryoshka"])
def test_sentence_transformers_trainer_trains_the_encoder_as_sentence_transformer(minilm_dir, data_dir, tmp_path,
                                                                                  recompute, variant):
    """SentenceTransformerTrainer, sentence-transformers' way to train since v3 (its datasets, loss, arguments and
    model card), trains SentenceEncoder as SentenceTransformer on MRPC paraphrases: the same losses step by step
    (dropout set to 0 in both, so that neither draws), the same vectors afterwards, and save_model writes a folder
    both load. With activation (gradient) checkpointing on in its arguments, the trainer turns recomputation on in both;
    MatryoshkaLoss (the loss at 384, 128 and 32 dimensions) trains both alike too."""
    import csv

    datasets = pytest.importorskip("datasets")
    from bertforge import SentenceEncoder

    losses_module = importlib.import_module("sentence_transformers.losses")
    with open(data_dir / "mrpc" / "train.tsv", encoding="utf-8-sig") as handle:
        pairs = [(row["#1 String"], row["#2 String"]) for row in csv.DictReader(handle, delimiter="\t",
                                                                                quoting=csv.QUOTE_NONE)
                 if row["Quality"] == "1"][:48]
    data = datasets.Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [b for _, b in pairs]})
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    models = {"ours": SentenceEncoder(minilm_dir, config_kwargs=no_dropout),
              "theirs": sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu",
                                                                 config_kwargs=no_dropout)}
    losses = {}
    for name, model in models.items():
        arguments = sentence_transformers.SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / name), num_train_epochs=1, per_device_train_batch_size=16, learning_rate=1e-4,
            logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
            **{recompute: variant == "gradient checkpointing"})
        loss = losses_module.MultipleNegativesRankingLoss(model)
        if variant == "matryoshka":
            loss = losses_module.MatryoshkaLoss(model, loss, [384, 128, 32])
        trainer = sentence_transformers.SentenceTransformerTrainer(model=model, args=arguments, train_dataset=data,
                                                                   loss=loss)
        trainer.train()
        losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        trainer.save_model(str(tmp_path / name / "final"))
    assert len(losses["ours"]) == 3 and losses["ours"][-1] < losses["ours"][0]
    torch.testing.assert_close(torch.tensor(losses["ours"]), torch.tensor(losses["theirs"]), atol=1e-4, rtol=0)
    assert models["ours"].model.is_gradient_checkpointing is (variant == "gradient checkpointing")
    texts = [first for first, _ in pairs[:4]]
    expected = models["theirs"].encode(texts)
    assert cosines(models["ours"].encode(texts), expected).min() > 0.9999
    assert models["ours"].model_card_data.model is models["ours"]  # the trainer recorded on sentence-transformers' card
    saved = sentence_transformers.SentenceTransformer(str(tmp_path / "ours" / "final"), device="cpu")
    assert cosines(saved.encode(texts), expected).min() > 0.9999
    assert cosines(SentenceEncoder(tmp_path / "ours" / "final").encode(texts), expected).min() > 0.9999


def test_sentence_transformers_trainer_resumes_and_keeps_the_best_checkpoint(minilm_dir, data_dir, tmp_path):
    """The trainer reloads checkpoints it saved of SentenceEncoder as of its own model: resuming half-way ends
    where training straight through ends, and load_best_model_at_end leaves the best checkpoint's weights (the
    best here is the highest eval loss, so that it is not the last checkpoint)."""
    import csv

    datasets = pytest.importorskip("datasets")
    from bertforge import SentenceEncoder

    losses_module = importlib.import_module("sentence_transformers.losses")
    with open(data_dir / "mrpc" / "train.tsv", encoding="utf-8-sig") as handle:
        pairs = [(row["#1 String"], row["#2 String"]) for row in csv.DictReader(handle, delimiter="\t",
                                                                                quoting=csv.QUOTE_NONE)
                 if row["Quality"] == "1"][:40]
    data = datasets.Dataset.from_dict({"anchor": [a for a, _ in pairs[:32]], "positive": [b for _, b in pairs[:32]]})
    held_out = datasets.Dataset.from_dict({"anchor": [a for a, _ in pairs[32:]],
                                           "positive": [b for _, b in pairs[32:]]})
    texts = [first for first, _ in pairs[:4]]

    def train(resume_from: str | None = None) -> tuple:
        model = SentenceEncoder(minilm_dir, config_kwargs={"hidden_dropout_prob": 0.0,
                                                           "attention_probs_dropout_prob": 0.0})
        arguments = sentence_transformers.SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / "run"), num_train_epochs=2, per_device_train_batch_size=8, learning_rate=1e-4,
            save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2, report_to=[], use_cpu=True,
            seed=0, load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True)
        trainer = sentence_transformers.SentenceTransformerTrainer(
            model=model, args=arguments, train_dataset=data, eval_dataset=held_out,
            loss=losses_module.MultipleNegativesRankingLoss(model))
        trainer.train(resume_from_checkpoint=resume_from)
        return model, trainer

    model, trainer = train()
    best, last = trainer.state.best_model_checkpoint, str(tmp_path / "run" / "checkpoint-8")
    assert best is not None and best != last
    vectors = model.encode(texts)
    np.testing.assert_allclose(vectors, SentenceEncoder(best).encode(texts), atol=1e-6)
    assert cosines(vectors, SentenceEncoder(last).encode(texts)).min() < 0.99999  # training moved past the best

    resumed, _ = train(resume_from=str(tmp_path / "run" / "checkpoint-4"))
    np.testing.assert_allclose(resumed.encode(texts), vectors, atol=1e-5)


# sentence-transformers' losses, each with the columns it reads: (loss, dataset kind, its options given the model)
LOSSES = {
    "MultipleNegativesSymmetricRankingLoss": ("pair", {}),
    "CachedMultipleNegativesRankingLoss": ("pair", {"mini_batch_size": 2}),
    "CachedMultipleNegativesSymmetricRankingLoss": ("pair", {"mini_batch_size": 2}),
    "MegaBatchMarginLoss": ("pair", {"mini_batch_size": 2}),
    "TripletLoss": ("triplet", {}),
    "GlobalOrthogonalRegularizationLoss": ("triplet", {}),
    "SoftmaxLoss": ("label", {"sentence_embedding_dimension": 32, "num_labels": 2}),
    "ContrastiveLoss": ("label", {}),
    "OnlineContrastiveLoss": ("label", {}),
    "CosineSimilarityLoss": ("score", {}),
    "CoSENTLoss": ("score", {}),
    "AnglELoss": ("score", {}),
    "BatchAllTripletLoss": ("classes", {}),
    "BatchHardSoftMarginTripletLoss": ("classes", {}),
    "MarginMSELoss": ("margin", {}),
    "DistillKLDivLoss": ("teacher scores", {}),
    "MSELoss": ("teacher vectors", {}),
}


@pytest.mark.parametrize("name", LOSSES)
def test_sentence_transformers_losses_train_it(tiny_model_dir, data_dir, tmp_path, name):
    """The rest of sentence-transformers' losses for SentenceTransformer, each on the columns it reads (MRPC
    sentences; labels, scores and teacher outputs made up), train SentenceEncoder through SentenceTransformerTrainer:
    a finite loss, and every layer's weights move."""
    import csv

    datasets = pytest.importorskip("datasets")
    from bertforge import SentenceEncoder

    with open(data_dir / "mrpc" / "train.tsv", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:8]
    first, second = [row["#1 String"] for row in rows], [row["#2 String"] for row in rows]
    third = second[1:] + second[:1]
    labels = [int(row["Quality"]) for row in rows]
    columns = {
        "pair": {"anchor": first, "positive": second},
        "triplet": {"anchor": first, "positive": second, "negative": third},
        "label": {"sentence1": first, "sentence2": second, "label": labels},
        "score": {"sentence1": first, "sentence2": second, "score": [i / 8 for i in range(8)]},
        "classes": {"sentence": first, "label": [i % 3 for i in range(8)]},
        "margin": {"query": first, "positive": second, "negative": third, "label": [0.5] * 8},
        "teacher scores": {"query": first, "positive": second, "negative": third, "label": [[0.9, 0.1]] * 8},
        "teacher vectors": {"sentence": first, "label": [[0.05] * 32] * 8},
    }[LOSSES[name][0]]
    torch.manual_seed(0)
    model = SentenceEncoder(tiny_model_dir)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    loss = getattr(importlib.import_module("sentence_transformers.losses"), name)(model, **LOSSES[name][1])
    arguments = sentence_transformers.SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    trainer = sentence_transformers.SentenceTransformerTrainer(
        model=model, args=arguments, train_dataset=datasets.Dataset.from_dict(columns), loss=loss)
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all(np.isfinite(logged))
    moved = {key.split(".layers.")[1].split(".")[0] for key, value in model.state_dict().items()
             if ".layers." in key and not torch.equal(value, before[key])}
    assert moved == {"0", "1"}


@pytest.mark.parametrize("saved", [
    {"tokenizer_args": {"do_lower_case": False}},  # the names before sentence-transformers 5
    {"processor_kwargs": {"model_max_length": 12}},  # wins over max_seq_length
    {"config_args": {"hidden_act": "relu"}},
    {"config_kwargs": {"layer_norm_eps": 1e-2}, "model_kwargs": {"add_pooling_layer": False}},
    {"model_kwargs": {"torch_dtype": "bfloat16"}},
], ids=["tokenizer_args", "processor_kwargs", "config_args", "config_kwargs", "model_kwargs"])
def test_the_loading_options_a_folder_saves_apply_as_in_sentence_transformers(minilm_dir, squad_contexts, tmp_path,
                                                                             saved):
    """sentence_bert_config.json may hold the options sentence-transformers loads the model, its tokenizer and its
    config with; SentenceEncoder applies them too (they were ignored), so both give the same vectors on real text
    with capitals and long paragraphs, vectors that differ from the model's without them."""
    import shutil

    from bertforge import SentenceEncoder

    folder = tmp_path / "model"
    shutil.copytree(minilm_dir, folder)
    config_file = folder / "sentence_bert_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | saved))
    texts = ["Apollo Eleven Landed On The Moon In July 1969.", *squad_contexts[:3]]
    ours = SentenceEncoder(folder)
    expected = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts)
    without = SentenceEncoder(minilm_dir).encode(texts)
    if "model_kwargs" in saved and "torch_dtype" in saved["model_kwargs"]:
        assert ours.model.dtype == torch.bfloat16  # bfloat16's rounding, in two different orders
        assert cosines(ours.encode(texts), expected).min() > 0.999
    else:
        np.testing.assert_allclose(ours.encode(texts), expected, atol=1e-5)
        assert np.abs(ours.encode(texts) - without).max() > 1e-3


def test_loading_options_bert_has_no_use_for_are_ignored_as_sentence_transformers_ignores_them(
        minilm_dir, squad_contexts, tmp_path, caplog):
    import shutil

    from bertforge import SentenceEncoder

    folder = tmp_path / "model"
    shutil.copytree(minilm_dir, folder)
    config_file = folder / "sentence_bert_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {
        "processor_kwargs": {"add_prefix_space": True}, "config_kwargs": {"rope_theta": 10000.0}}))
    with caplog.at_level("WARNING", logger="bertforge"):
        vectors = SentenceEncoder(folder).encode(squad_contexts[:2])
    assert "add_prefix_space: no setting of BERT's tokenizer; ignored" in caplog.text
    assert "rope_theta: no setting of BERT's; ignored" in caplog.text
    expected = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(squad_contexts[:2])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    config_file.write_text(json.dumps({"model_kwargs": {"dtype": "int8"}}))
    with pytest.raises(ConfigError, match=r"sentence_bert_config.json: dtype must be a floating-point torch dtype"):
        SentenceEncoder(folder)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_an_encoder_cast_to_another_precision_answers_in_its_dtype_as_sentence_transformer(long_texts, minilm_dir,
                                                                                           dtype):
    from bertforge import SentenceEncoder

    texts = long_texts[:3]
    ours = SentenceEncoder(minilm_dir, model_kwargs={"dtype": dtype})
    theirs = sentence_transformers.SentenceTransformer(str(minilm_dir), model_kwargs={"dtype": dtype})
    for options in ({"convert_to_tensor": True}, {}, {"output_value": "token_embeddings"}):
        mine, reference = ours.encode(texts, **options), theirs.encode(texts, **options)
        mine, reference = (mine[0], reference[0]) if isinstance(mine, list) else (mine, reference)
        assert mine.dtype == reference.dtype and type(mine) is type(reference), options
        # the same half-precision model; the sums run in another order (bfloat16 keeps 8 bits of mantissa)
        difference = (torch.as_tensor(mine).double() - torch.as_tensor(reference).double()).abs().max()
        assert difference < {torch.bfloat16: 0.05, torch.float16: 0.005, torch.float64: 1e-12}[dtype], options
