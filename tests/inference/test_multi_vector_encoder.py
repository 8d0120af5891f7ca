"""ColBERT: MultiVectorEncoder against sentence-transformers' MultiVectorEncoder, on the three layouts a ColBERT
checkpoint comes in (sentence-transformers' own, PyLate's, Stanford's), on real text (SQuAD questions and
paragraphs, SST-2 reviews).

The encoder is the real all-MiniLM-L6-v2; its projection to 128 dimensions is seeded random (no ColBERT checkpoint
ships in a wheel), which makes every vector depend on both. sentence-transformers writes its own layout; the PyLate
and Stanford folders are written here in those projects' file formats, and sentence-transformers' loader, which
reads both, is the reference for how they are read."""

import json
import re
import shutil
import string
from pathlib import Path

import numpy
import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge import ConfigError, InputError, MultiVectorEncoder, SentenceEncoder, extract_features
from bertforge.inference import maxsim, maxsim_pairwise

sentence_transformers = pytest.importorskip("sentence_transformers")
if not hasattr(sentence_transformers, "MultiVectorEncoder"):  # sentence-transformers 6.3 introduced it
    pytest.skip("sentence-transformers without MultiVectorEncoder", allow_module_level=True)
from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: E402
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask  # noqa: E402

TOLERANCE = 2e-5


def projection(seed: int, hidden: int = 384, width: int = 128) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(width, hidden, generator=generator) / hidden ** 0.5


def copy_encoder(source: Path, folder: Path, prefix: str = "") -> dict:
    folder.mkdir(parents=True)
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    return {prefix + name: tensor for name, tensor in load_file(source / "model.safetensors").items()}


def write_pylate(source: Path, folder: Path) -> Path:
    """PyLate's layout: Transformer and its Dense; the ColBERT settings as top-level fields."""
    save_file(copy_encoder(source, folder), folder / "model.safetensors")
    (folder / "1_Dense").mkdir()
    save_file({"linear.weight": projection(1)}, folder / "1_Dense" / "model.safetensors")
    (folder / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": 384, "out_features": 128, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity"}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 179, "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "ColBERT", "query_prefix": "[unused0]", "document_prefix": "[unused1]", "query_length": 24,
        "document_length": 60, "attend_to_expansion_tokens": False, "skiplist_words": list(string.punctuation),
        "similarity_fn_name": "MaxSim", "prompts": {}, "default_prompt_name": None}))
    return folder


def write_stanford(source: Path, folder: Path) -> Path:
    """Stanford's ColBERT: BERT weights under bert., the projection as linear.weight, artifact.metadata."""
    state = copy_encoder(source, folder, prefix="bert.") | {"linear.weight": projection(2)}
    save_file(state, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text()) | {"architectures": ["HF_ColBERT"]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "artifact.metadata").write_text(json.dumps({
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 32, "doc_maxlen": 180,
        "mask_punctuation": True, "attend_to_mask_tokens": False, "dim": 128}))
    return folder


def write_native(source: Path, folder: Path, expansion: dict, mask: dict | None, seed: int,
                 pooling: dict | None = None, **settings) -> Path:
    """sentence-transformers' own layout, as sentence-transformers writes it (mask None: no MultiVectorMask;
    pooling: its HierarchicalTokenPooling module's settings, last)."""
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    torch.manual_seed(seed)
    lengths = {key: settings.pop(key) for key in ("query_length", "document_length") if key in settings}
    model = sentence_transformers.MultiVectorEncoder(modules=[
        Transformer(str(source), query_expansion=expansion, **lengths),
        Dense(384, 96, bias=True, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"),
        *([] if mask is None else [MultiVectorMask(**mask)]), Normalize(module_input_name="token_embeddings"),
        *([] if pooling is None else [HierarchicalTokenPooling(**pooling)])], **settings)
    model.save(str(folder))
    return folder


@pytest.fixture(scope="module")
def colbert_dirs(minilm_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colbert")
    return {
        "native": write_native(minilm_dir, root / "native", {"strategy": "fixed", "length": 32},
                               {"skiplist_words": list(string.punctuation)}, seed=0, document_length=180,
                               prompts={"query": "[Q] ", "document": "[D] "}),
        # the other expansion: at least 16 tokens, attended to; the skiplist on both sides; MeanMaxSim
        "native_min": write_native(minilm_dir, root / "native_min", {"strategy": "min", "attend": True, "length": 16},
                                   {"skiplist_words": [",", ".", "?", "the"], "skiplist_tasks": ["query", "document"]},
                                   seed=1, query_length=40, similarity_fn_name="meanmaxsim"),
        # no MultiVectorMask module: a query's [MASK]s are computed but not scored
        "native_unmasked": write_native(minilm_dir, root / "native_unmasked", {"strategy": "fixed", "length": 24},
                                        None, seed=2),
        # documents pooled by the checkpoint's own HierarchicalTokenPooling module
        "native_pooled": write_native(minilm_dir, root / "native_pooled", {"strategy": "fixed", "length": 32},
                                      {"skiplist_words": list(string.punctuation)}, seed=3,
                                      pooling={"pool_factor": 2}, document_length=180),
        # an allowlist of the tokens a document scores (here every word piece id not divisible by 7: [CLS], [SEP]
        # and a seventh of the words dropped)
        "native_kept": write_native(minilm_dir, root / "native_kept", {"strategy": "fixed", "length": 32},
                                    {"skiplist_words": list(string.punctuation),
                                     "keep_only_token_ids": [token for token in range(999, 30522) if token % 7]},
                                    seed=4, document_length=180),
        "pylate": write_pylate(minilm_dir, root / "pylate"),
        "stanford": write_stanford(minilm_dir, root / "stanford"),
    }


@pytest.fixture(scope="module")
def squad_pairs(data_dir) -> list[tuple[str, str]]:
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = [paragraph for article in squad["data"][:3] for paragraph in article["paragraphs"][:2]]
    return [(paragraph["qas"][0]["question"], paragraph["context"]) for paragraph in paragraphs]


@pytest.fixture(scope="module")
def texts(squad_pairs, sst2_dev) -> dict[str, list[str]]:
    questions = [question for question, _ in squad_pairs]
    # a query longer than any query width (cut there), one of a single word
    queries = questions + [" ".join(questions), "Normandy"]
    # paragraphs longer than the document lengths, reviews full of punctuation, a one-word text
    documents = [context for _, context in squad_pairs] + [text for text, _ in sst2_dev[:5]] + ["Normandy"]
    return {"query": queries, "document": documents}


def assert_same_vectors(ours, theirs):
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs):
        assert mine.shape == reference.shape
        assert torch.allclose(torch.as_tensor(mine), torch.as_tensor(reference).cpu(), atol=TOLERANCE)


@pytest.mark.parametrize("layout", ["native", "native_min", "native_unmasked", "native_pooled", "native_kept",
                                    "pylate", "stanford"])
def test_matches_sentence_transformers(colbert_dirs, texts, layout):
    reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs[layout]))
    encoder = MultiVectorEncoder(colbert_dirs[layout])
    assert encoder.get_embedding_dimension() == reference.get_embedding_dimension()
    assert encoder.similarity_fn_name == reference.similarity_fn_name
    encoded = {}
    for role in ("query", "document"):
        theirs = getattr(reference, f"encode_{role}")(texts[role], batch_size=4)
        ours = getattr(encoder, f"encode_{role}")(texts[role], batch_size=4)
        assert_same_vectors(ours, theirs)
        encoded[role] = theirs
    # a text of no role: no prompt, no [MASK]s, the skiplist of a document
    assert_same_vectors(encoder.encode(texts["query"][:3]), reference.encode(texts["query"][:3]))
    queries, documents = encoded["query"], encoded["document"]
    assert torch.allclose(encoder.similarity(queries, documents), reference.similarity(queries, documents),
                          atol=1e-4)
    pairs = len(queries)
    assert torch.allclose(encoder.similarity_pairwise(queries, documents[:pairs]),
                          reference.similarity_pairwise(queries, documents[:pairs]), atol=1e-4)


def test_the_right_paragraph_ranks_first(colbert_dirs, squad_pairs):
    """MaxSim on these vectors is a retriever even with an untrained projection: each SQuAD question's own paragraph
    is its best among the others, as the reference ranks them."""
    encoder = MultiVectorEncoder(colbert_dirs["stanford"])
    reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs["stanford"]))
    questions = [question for question, _ in squad_pairs]
    paragraphs = [context for _, context in squad_pairs]
    scores = reference.similarity(reference.encode_query(questions), reference.encode_document(paragraphs))
    for i, question in enumerate(questions):
        ranked = encoder.rank(question, paragraphs, top_k=3, return_documents=True)
        assert [hit["corpus_id"] for hit in ranked] == scores[i].argsort(descending=True)[:3].tolist()
        assert ranked[0]["text"] == paragraphs[ranked[0]["corpus_id"]]
        assert ranked[0]["score"] == pytest.approx(scores[i].max().item(), abs=1e-3)
    assert (scores.argmax(1) == torch.arange(len(questions))).float().mean() >= 0.8


@pytest.mark.parametrize("layout", ["stanford", "native_min", "native_unmasked", "native_pooled", "native_kept"])
def test_save_round_trip(colbert_dirs, texts, tmp_path, layout):
    """save writes sentence-transformers' layout whatever the model came in (the markers in the tokenizer, so
    [unused0] stays one token): both libraries load it and encode as the original."""
    original = sentence_transformers.MultiVectorEncoder(str(colbert_dirs[layout]))
    MultiVectorEncoder(colbert_dirs[layout]).save(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config_sentence_transformers.json").read_text())[
        "model_type"] == "MultiVectorEncoder"
    for loaded in (sentence_transformers.MultiVectorEncoder(str(tmp_path / "saved")),
                   MultiVectorEncoder(tmp_path / "saved")):
        assert loaded.similarity_fn_name == original.similarity_fn_name
        for role in ("query", "document"):
            assert_same_vectors(getattr(loaded, f"encode_{role}")(texts[role][:4]),
                                getattr(original, f"encode_{role}")(texts[role][:4]))


def test_onnx_backend_encodes_as_sentence_transformers(colbert_dirs, texts, tmp_path):
    """backend="onnx": the BERT encoder exported and run by ONNX Runtime, the projection, [MASK]s (attended to or
    not) and skiplist as before, gives sentence-transformers' (torch) token vectors; save() writes onnx/model.onnx,
    which a reload runs without exporting again, and its int8 file loads by file_name. It does not train."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bertforge import export_dynamic_quantized_onnx_model

    for layout in ("native", "native_min"):
        reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs[layout]))
        encoder = MultiVectorEncoder(colbert_dirs[layout], backend="onnx")
        assert encoder.get_backend() == "onnx"
        for role in ("query", "document"):
            assert_same_vectors(getattr(encoder, f"encode_{role}")(texts[role], batch_size=4),
                                getattr(reference, f"encode_{role}")(texts[role], batch_size=4))
    encoder.save(tmp_path / "saved")
    assert (tmp_path / "saved" / "onnx" / "model.onnx").is_file()
    again = MultiVectorEncoder(tmp_path / "saved", backend="onnx", model_kwargs={"export": False})
    expected = reference.encode_query(texts["query"][:4])
    assert_same_vectors(again.encode_query(texts["query"][:4]), expected)
    written = export_dynamic_quantized_onnx_model(again, "avx512", tmp_path / "saved")
    int8 = MultiVectorEncoder(tmp_path / "saved", backend="onnx", model_kwargs={"file_name": f"onnx/{written.name}"})
    documents = reference.encode_document(texts["document"][:4])
    scores, exact = int8.similarity(int8.encode_query(texts["query"][:4]), documents), reference.similarity(
        expected, documents)
    # int8's rounding, no more: each question still finds its own paragraph
    assert 1e-4 < (scores - exact).abs().mean() < 0.03
    assert scores.argmax(1).tolist() == exact.argmax(1).tolist() == [0, 1, 2, 3]
    encoder.train()
    with pytest.raises(ConfigError, match="does not train"):
        encoder(encoder.preprocess(["a question"], task="query"), task="query")


def test_a_new_colbert_model(minilm_dir, texts, tmp_path):
    """Another BERT checkpoint (here a sentence-transformers model) becomes a new ColBERT model as
    sentence-transformers makes one: its pooling dropped, a new projection to 128 dimensions (random: the
    reference's is copied over), no [MASK]s, no skiplist, its max_seq_length; saved, it is a ColBERT checkpoint."""
    reference = sentence_transformers.MultiVectorEncoder(str(minilm_dir))
    encoder = MultiVectorEncoder(minilm_dir)
    assert encoder.get_embedding_dimension() == reference.get_embedding_dimension() == 128
    assert encoder.max_seq_length == reference.max_seq_length == 256
    encoder.projection[0].weight.data.copy_(reference[1].linear.weight.data)
    for role in ("query", "document"):
        assert_same_vectors(getattr(encoder, f"encode_{role}")(texts[role]),
                            getattr(reference, f"encode_{role}")(texts[role]))
    encoder.save(tmp_path / "new")
    assert_same_vectors(sentence_transformers.MultiVectorEncoder(str(tmp_path / "new")).encode_query(texts["query"]),
                        reference.encode_query(texts["query"]))
    assert_same_vectors(MultiVectorEncoder(tmp_path / "new").encode_document(texts["document"]),
                        reference.encode_document(texts["document"]))
    torch.manual_seed(0)
    first = MultiVectorEncoder("default").projection[0].weight
    torch.manual_seed(0)
    assert torch.equal(first, MultiVectorEncoder("default").projection[0].weight)


def test_encode_options(colbert_dirs, texts):
    """sentence-transformers' options: a single text, numpy, truncate_dim (then unit length again), prompts by name
    and given, meanmaxsim set on the model."""
    folder = str(colbert_dirs["native"])
    reference = sentence_transformers.MultiVectorEncoder(folder)
    encoder = MultiVectorEncoder(folder)
    query = texts["query"][0]
    single = encoder.encode_query(query)
    assert isinstance(single, torch.Tensor) and single.dim() == 2
    assert_same_vectors([single], [reference.encode_query(query)])
    arrays = encoder.encode_document(texts["document"][:2], convert_to_numpy=True)
    assert all(isinstance(array, numpy.ndarray) for array in arrays)
    assert_same_vectors(arrays, reference.encode_document(texts["document"][:2], convert_to_numpy=True))
    cut = encoder.encode_query(texts["query"][:2], truncate_dim=32)
    assert_same_vectors(cut, reference.encode_query(texts["query"][:2], truncate_dim=32))
    assert torch.allclose(cut[0].norm(dim=-1), torch.ones(len(cut[0])), atol=1e-5)
    assert_same_vectors(encoder.encode(texts["query"][:2], prompt_name="document", task="query"),
                        reference.encode(texts["query"][:2], prompt_name="document", task="query"))
    assert_same_vectors(encoder.encode_query(texts["query"][:2], prompt="search: "),
                        reference.encode_query(texts["query"][:2], prompt="search: "))
    # PyLate's encode(is_query=...): a query or a document as encode_query and encode_document give them
    pylate = MultiVectorEncoder(str(colbert_dirs["pylate"]))
    assert_same_vectors(pylate.encode(texts["query"][:3], is_query=True), pylate.encode_query(texts["query"][:3]))
    assert_same_vectors(pylate.encode(texts["document"][:3], is_query=False),
                        pylate.encode_document(texts["document"][:3]))
    assert len(pylate.encode(texts["query"][0], is_query=True)) != len(pylate.encode(texts["query"][0]))
    with pytest.raises(InputError, match="give task or is_query, not both"):
        pylate.encode(texts["query"][:1], is_query=True, task="query")
    with pytest.raises(InputError, match="is_query must be true or false"):
        pylate.encode(texts["query"][:1], is_query="yes")
    truncated = MultiVectorEncoder(folder, truncate_dim=64, similarity_fn_name="meanmaxsim")
    reference = sentence_transformers.MultiVectorEncoder(folder, truncate_dim=64, similarity_fn_name="meanmaxsim")
    queries, documents = truncated.encode_query(texts["query"][:3]), truncated.encode_document(texts["document"][:3])
    assert queries[0].shape[1] == truncated.get_embedding_dimension() == 64
    assert_same_vectors(documents, reference.encode_document(texts["document"][:3]))
    assert torch.allclose(truncated.similarity(queries, documents), reference.similarity(queries, documents),
                          atol=1e-5)


def test_maxsim_matches_sentence_transformers():
    """The scoring alone, on ragged lists, padded tensors and single texts, with and without length
    normalisation."""
    from sentence_transformers.util import similarity as reference

    generator = torch.Generator().manual_seed(0)
    queries = [torch.randn(length, 8, generator=generator) for length in (3, 7, 1)]
    documents = [torch.randn(length, 8, generator=generator) for length in (5, 2, 9, 4)]
    for normalize in (False, True):
        assert torch.allclose(maxsim(queries, documents, length_normalize=normalize),
                              reference.maxsim(queries, documents, length_normalize=normalize), atol=1e-5)
        assert torch.allclose(maxsim_pairwise(queries, documents[:3], length_normalize=normalize),
                              reference.maxsim_pairwise(queries, documents[:3], length_normalize=normalize), atol=1e-5)
    padded = torch.randn(2, 6, 8, generator=generator)
    assert torch.allclose(maxsim(padded, documents), reference.maxsim(padded, documents), atol=1e-5)
    assert torch.allclose(maxsim(queries[0], documents[1].numpy()), reference.maxsim(queries[0], documents[1]),
                          atol=1e-5)


def test_refusals(colbert_dirs, run_cli, tmp_path):
    """A checkpoint of the other kind, and options that don't apply, are one-line errors that name them."""
    for layout in ("native", "pylate", "stanford"):
        with pytest.raises(ConfigError, match="MultiVectorEncoder"):
            SentenceEncoder(colbert_dirs[layout])
    from bertforge import BertModel, BertTokenizer

    model = BertModel.from_pretrained(colbert_dirs["pylate"])
    with pytest.raises(ConfigError, match="multi-vector"):
        extract_features(model, BertTokenizer.from_pretrained(colbert_dirs["pylate"]), ["a text"])
    lines = tmp_path / "lines.txt"
    lines.write_text("A text.\n")
    for flags, named in ((["--output", tmp_path / "vectors.npy"], ".jsonl"),
                         (["--output", tmp_path / "vectors.jsonl", "--level", "word"], "--level word"),
                         (["--similar", "a", "--precision", "int8"], "--precision int8")):
        code, _, err = run_cli("embed", "--model", colbert_dirs["native"], "--input", lines, *flags)
        assert code != 0 and len(err.splitlines()) == 1 and named in err and "Traceback" not in err
    assert not (tmp_path / "vectors.npy").exists() and not (tmp_path / "vectors.jsonl").exists()
    code, _, err = run_cli("similarity", "--model", colbert_dirs["native"], "a cat", "a dog", "--layers",
                           "sum_last_four")
    assert code != 0 and "--layers sum_last_four" in err and len(err.splitlines()) == 1
    pytest.importorskip("fastapi")
    from bertforge.inference.serve.app import load_app
    from bertforge.inference.serve.settings import ServeSettings

    assert load_app(colbert_dirs["stanford"], ServeSettings(pooling="mean")) is not None  # its encoder, pooled
    encoder = MultiVectorEncoder(colbert_dirs["native"])
    with pytest.raises(InputError, match="convert_to_tensor"):
        encoder.encode(["a"], convert_to_tensor=True)
    with pytest.raises(InputError, match="task 'passage'"):
        encoder.encode(["a"], task="passage")
    with pytest.raises(InputError, match="prompt_name 'title'"):
        encoder.encode(["a"], prompt_name="title")
    with pytest.raises(InputError, match="pairs them one to one"):
        encoder.similarity_pairwise(encoder.encode_query(["a", "b"]), encoder.encode_document(["c"]))
    with pytest.raises(ConfigError, match="similarity_fn_name"):
        encoder.similarity_fn_name = "cosine"
    with pytest.raises(ConfigError, match="backend 'openvino': MultiVectorEncoder runs 'torch' or 'onnx'"):
        MultiVectorEncoder(colbert_dirs["native"], backend="openvino")
    # token vectors normalized, then projected: sentence-transformers runs it, bertforge says it doesn't
    sentence_transformers.MultiVectorEncoder(modules=[
        Transformer(str(colbert_dirs["native"])), Normalize(module_input_name="token_embeddings"),
        Dense(384, 64, module_input_name="token_embeddings")]).save(str(tmp_path / "late_dense"))
    with pytest.raises(ConfigError, match="a Dense module after Normalize is not supported"):
        MultiVectorEncoder(tmp_path / "late_dense")
    # token pooling in the middle of the modules; a pooling config of the wrong kind
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling
    sentence_transformers.MultiVectorEncoder(modules=[
        Transformer(str(colbert_dirs["native"])), HierarchicalTokenPooling(pool_factor=2),
        Normalize(module_input_name="token_embeddings")]).save(str(tmp_path / "early_pooling"))
    with pytest.raises(ConfigError, match="HierarchicalTokenPooling before other modules is not supported"):
        MultiVectorEncoder(tmp_path / "early_pooling")
    pooled = tmp_path / "pooled"
    shutil.copytree(colbert_dirs["native_pooled"], pooled)
    config = next(pooled.glob("*_HierarchicalTokenPooling")) / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"pool_factor": 0.5}))
    with pytest.raises(ConfigError, match=r"HierarchicalTokenPooling/config.json: pool_factor must be at least 1"):
        MultiVectorEncoder(pooled)
    config = next(pooled.glob("*_MultiVectorMask")) / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"keep_only_token_ids": ["[CLS]"]}))
    with pytest.raises(ConfigError, match=r"MultiVectorMask/config.json: keep_only_token_ids must be a list of token"):
        MultiVectorEncoder(pooled)


def test_arguments_of_the_wrong_kind_are_named(colbert_dirs):
    """A string of documents was ranked character by character; the others failed deep in torch or Python."""
    encoder = MultiVectorEncoder(colbert_dirs["native"])
    queries, documents = encoder.encode_query(["a cat"]), encoder.encode_document(["a cat sat.", "a dog ran."])
    failures = {
        "rank takes a query text and a list of document texts": lambda: encoder.rank("a", "abc"),
        "inputs must be a string or a list of strings, got NoneType": lambda: encoder.encode_query(None),
        "token_pooling must pool token vectors, such as HierarchicalTokenPooling(...), got 'x'": lambda: (
            encoder.encode_document(["a text"], token_pooling="x")),
        "prompt must be a text, got 5": lambda: encoder.encode_query(["a text"], prompt=5),
        f"queries have token vectors of {encoder.get_embedding_dimension()} dimensions, documents of 10": lambda: (
            encoder.similarity(queries, [vectors[:, :10] for vectors in documents])),
        "queries: expected per-text token vectors, as encode gives them; got NoneType": lambda: (
            encoder.similarity(None, documents)),
    }
    for message, call in failures.items():
        with pytest.raises(InputError, match=re.escape(message)):
            call()
    with pytest.raises(ConfigError, match=re.escape("MultiVectorEncoder: prompts must be a dict, got 'x'")):
        MultiVectorEncoder(colbert_dirs["native"], prompts="x")
    with pytest.raises(InputError, match="token_pooling must pool token vectors"):
        MultiVectorEncoder(colbert_dirs["native"], token_pooling="x")


@pytest.mark.parametrize("layout", ["native", "pylate", "native_min", "native_pooled"])
def test_serve_gives_sentence_transformers_vectors_and_scores(colbert_dirs, texts, layout):
    """`bertforge serve` on a ColBERT folder: PyLate's server's /v1/embeddings (queries unless is_query is false),
    Jina's /v1/multi-vector (documents unless input_type says query), and MaxSim at /rerank, Cohere's /v1/rerank and
    /similarity, each as sentence-transformers' MultiVectorEncoder gives them on the same folder."""
    pytest.importorskip("fastapi")
    import base64

    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app

    reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs[layout]), device="cpu")
    queries, documents = texts["query"][:4], texts["document"]
    their_queries, their_documents = reference.encode_query(queries), reference.encode_document(documents)
    their_scores = reference.similarity(their_queries, their_documents)

    def matrices(answer, key="embedding"):
        assert answer.status_code == 200, answer.text
        return [torch.tensor(item[key]) for item in answer.json()["data"]]

    with TestClient(load_app(colbert_dirs[layout])) as client:
        assert_same_vectors(matrices(client.post("/v1/embeddings", json={"input": queries, "model": "m"})),
                            their_queries)
        assert_same_vectors(matrices(client.post("/v1/embeddings", json={"input": documents, "is_query": False})),
                            their_documents)
        assert_same_vectors(matrices(client.post("/v1/embeddings", json={"input": documents,
                                                                         "input_type": "document"})),
                            their_documents)
        assert_same_vectors(matrices(client.post("/v1/multi-vector", json={"input": documents}), "embeddings"),
                            their_documents)
        assert_same_vectors(matrices(client.post("/v1/multi-vector", json={"input": queries[0], "input_type": "query"}),
                                     "embeddings"), their_queries[:1])
        packed = client.post("/v1/multi-vector", json={"input": documents[:2], "embedding_type": "base64"}).json()
        for item, theirs in zip(packed["data"], their_documents):  # float32, one token vector after the other
            ours = numpy.frombuffer(base64.b64decode(item["embeddings"]), dtype="<f4").reshape(-1, theirs.shape[1])
            assert_same_vectors([torch.from_numpy(ours.copy())], [theirs])
        truncated = matrices(client.post("/v1/embeddings", json={"input": documents, "is_query": False,
                                                                 "dimensions": 32}))
        assert_same_vectors(truncated, reference.encode_document(documents, truncate_dim=32))
        for query in range(len(queries)):
            ranked = client.post("/rerank", json={"query": queries[query], "texts": documents}).json()
            expected = their_scores[query].tolist()
            assert [item["index"] for item in ranked] == sorted(range(len(documents)), key=lambda i: -expected[i])
            assert [item["score"] for item in ranked] == pytest.approx(sorted(expected, reverse=True), abs=1e-4)
        cohere = client.post("/v1/rerank", json={"query": queries[0], "documents": documents, "top_n": 2}).json()
        assert [item["index"] for item in cohere["results"]] == their_scores[0].argsort(descending=True)[:2].tolist()
        similar = client.post("/similarity", json={"inputs": {"source_sentence": queries[1],
                                                               "sentences": documents}}).json()
        assert similar == pytest.approx(their_scores[1].tolist(), abs=1e-4)
        info = client.get("/info").json()
        assert info["model_type"] == {"embedding": {"pooling": "multi_vector"}}
        # the fixtures' document lengths (native_min has none: the reference's max_seq_length)
        lengths = {"native": 180, "native_pooled": 180, "pylate": 60}
        assert info["max_input_length"] == lengths.get(layout, reference.max_seq_length)
        assert client.get("/health").json()["architecture"] == "MultiVectorEncoder"
        pooled = client.post("/embed", json={"inputs": documents})
        assert pooled.status_code == 409 and "/v1/multi-vector" in pooled.json()["error"]
        too_wide = client.post("/v1/multi-vector", json={"input": documents, "dimensions": 4096})
        assert too_wide.status_code == 400 and "dimensions: 4096" in too_wide.json()["error"]["message"]
        unknown = client.post("/v1/multi-vector", json={"input": documents, "input_type": "passage"})
        assert unknown.status_code == 400
    with TestClient(load_app("default")) as client:
        dense = client.post("/v1/multi-vector", json={"input": "A dense encoder."})
    assert dense.status_code == 409 and "not a multi-vector" in dense.json()["error"]["message"]


def test_openai_client_reads_the_token_vectors_of_a_served_colbert_model(colbert_dirs, texts):
    """The official openai client, as PyLate's server is called: floats nested per token, or base64 (the client's
    default), which it decodes into the token vectors one after the other."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app

    reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs["native"]), device="cpu")
    documents = texts["document"][:3]
    theirs = reference.encode_document(documents)
    with TestClient(load_app(colbert_dirs["native"])) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        nested = client.embeddings.create(input=documents, model="colbert", encoding_format="float",
                                          extra_body={"is_query": False})
        flat = client.embeddings.create(input=documents, model="colbert", extra_body={"input_type": "document"})
    assert_same_vectors([torch.tensor(item.embedding) for item in nested.data], theirs)
    assert_same_vectors([torch.tensor(item.embedding).reshape(-1, 96) for item in flat.data], theirs)
    read = [min(len(reference.tokenizer("[D] " + text)["input_ids"]), 180) for text in documents]
    assert nested.usage.total_tokens == sum(read)


@pytest.mark.parametrize("layout, wrapper", [("native", None), ("stanford", None), ("native_pooled", None),
                                             ("native", "matryoshka"), ("native", "token pooling")])
def test_sentence_transformers_loss_trains_it(colbert_dirs, squad_pairs, layout, wrapper):
    """sentence-transformers' MaxSim in-batch-negatives loss, built on this model, gives the loss and gradients it
    gives on its own MultiVectorEncoder with the same weights (the batch as each tokenizes it, role prompts); so do
    its MultiVectorMatryoshkaLoss (96 and 32 dimensions) and MultiVectorTokenPoolingLoss (unpooled, and pooled by
    half) around it."""
    from sentence_transformers.multi_vector_encoder.losses import (
        MultiVectorMatryoshkaLoss,
        MultiVectorMultipleNegativesRankingLoss,
        MultiVectorTokenPoolingLoss,
    )
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    def built(model):
        loss = MultiVectorMultipleNegativesRankingLoss(model)
        if wrapper == "matryoshka":
            return MultiVectorMatryoshkaLoss(model, loss, [96, 32])
        if wrapper == "token pooling":
            return MultiVectorTokenPoolingLoss(model, loss, [None, HierarchicalTokenPooling(pool_factor=2)])
        return loss

    reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs[layout]))
    encoder = MultiVectorEncoder(colbert_dirs[layout])
    questions, paragraphs = [q for q, _ in squad_pairs[:4]], [c for _, c in squad_pairs[:4]]
    losses = []
    for model in (reference, encoder):
        batch = [model.preprocess(texts, prompt=model.prompts.get(role), task=role) | {"task": role}
                 for role, texts in (("query", questions), ("document", paragraphs))]
        loss = built(model)(batch, None)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-6)
    gradients = [(reference[1].linear.weight.grad, encoder.projection[0].weight.grad),
                 (reference[0].auto_model.encoder.layer[3].intermediate.dense.weight.grad,
                  encoder.model.encoder.layers[3].feed_forward.up.weight.grad)]
    for theirs, ours in gradients:
        assert torch.allclose(ours, theirs, atol=1e-6 + 1e-3 * theirs.abs().max().item())


def test_fit_learns_to_retrieve(tiny_model_dir, data_dir):
    """A new ColBERT model over a random tiny BERT, trained by fit with sentence-transformers' loss on 256 SQuAD
    (question, paragraph) pairs, ranks the paragraphs of 100 other questions far better than before; and
    sentence-transformers' own retrieval evaluator scores it."""
    from sentence_transformers import InputExample
    from sentence_transformers.multi_vector_encoder.evaluation import MultiVectorInformationRetrievalEvaluator
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss
    from torch.utils.data import DataLoader

    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    pairs = [(paragraph["qas"][0]["question"], paragraph["context"]) for article in squad["data"]
             for paragraph in article["paragraphs"]]
    train, held_out = pairs[:256], pairs[-100:]

    def mean_reciprocal_rank(encoder) -> float:
        scores = encoder.similarity(encoder.encode_query([q for q, _ in held_out]),
                                    encoder.encode_document([c for _, c in held_out]))
        ranks = (scores > scores.diag()[:, None]).sum(1) + 1
        return (1 / ranks.float()).mean().item()

    torch.manual_seed(0)
    encoder = MultiVectorEncoder(tiny_model_dir)
    before = mean_reciprocal_rank(encoder)
    loader = DataLoader([InputExample(texts=[q, c]) for q, c in train], batch_size=16, shuffle=True)
    encoder.fit([(loader, MultiVectorMultipleNegativesRankingLoss(encoder))], epochs=2, warmup_steps=2,
                optimizer_params={"lr": 1e-3}, show_progress_bar=False)
    after = mean_reciprocal_rank(encoder)
    assert before < 0.4 and after > before + 0.25, (before, after)
    evaluator = MultiVectorInformationRetrievalEvaluator(
        queries={str(i): q for i, (q, _) in enumerate(held_out)},
        corpus={str(i): c for i, (_, c) in enumerate(held_out)},
        relevant_docs={str(i): {str(i)} for i in range(len(held_out))}, mrr_at_k=[100], name="squad")
    metrics = encoder.evaluate(evaluator)
    assert metrics["squad_maxsim_mrr@100"] == pytest.approx(after, abs=0.02)


def test_multi_process_pool(colbert_dirs, texts):
    """A pool of two worker processes (started, or a list of devices for one call) gives what one process gives."""
    encoder = MultiVectorEncoder(colbert_dirs["stanford"])
    expected = encoder.encode_query(texts["query"])
    pool = encoder.start_multi_process_pool(["cpu", "cpu"])
    try:
        assert_same_vectors(encoder.encode_query(texts["query"], pool=pool, chunk_size=3), expected)
    finally:
        encoder.stop_multi_process_pool(pool)
    assert_same_vectors(encoder.encode_document(texts["document"], device=["cpu", "cpu"]),
                        encoder.encode_document(texts["document"]))


def test_embed_command(colbert_dirs, texts, run_cli, tmp_path):
    """`bertforge embed` on a ColBERT folder: each line's token vectors as a document (JSON lines), or the lines
    ranked by MaxSim with --similar, as MultiVectorEncoder gives them; --pool pools its encoder instead."""
    folder = colbert_dirs["stanford"]
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(texts["document"]) + "\n", encoding="utf-8")
    code, _, err = run_cli("embed", "--model", folder, "--input", lines, "--output", tmp_path / "tokens.jsonl")
    assert code == 0, err
    written = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text(encoding="utf-8").splitlines()]
    encoder = MultiVectorEncoder(folder)
    assert [row["text"] for row in written] == texts["document"]
    assert_same_vectors([torch.tensor(row["embeddings"]) for row in written],
                        encoder.encode_document(texts["document"]))
    query = texts["query"][0]
    code, out, err = run_cli("embed", "--model", folder, "--input", lines, "--similar", query, "--top-k", "3")
    assert code == 0, err
    ranked = encoder.rank(query, texts["document"], top_k=3)
    assert [int(line.split("line ")[1].split(":")[0]) - 1 for line in out.splitlines()] == [
        hit["corpus_id"] for hit in ranked]
    code, _, err = run_cli("embed", "--model", folder, "--input", lines, "--pool", "mean", "--output",
                           tmp_path / "pooled.npy")
    assert code == 0 and numpy.load(tmp_path / "pooled.npy").shape == (len(texts["document"]), 384), err


def test_similarity_command(colbert_dirs, texts, run_cli):
    """`bertforge similarity` on a ColBERT folder: the MaxSim table, each row's sentence as the query and each
    column's as the document, as sentence-transformers' MultiVectorEncoder scores them (printed to 2 decimals)."""
    sentences = [texts["query"][0], texts["document"][0], texts["document"][5], texts["query"][1]]
    code, out, err = run_cli("similarity", "--model", colbert_dirs["pylate"], *sentences)
    assert code == 0, err
    reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs["pylate"]), device="cpu")
    expected = reference.similarity(reference.encode_query(sentences), reference.encode_document(sentences))
    lines = out.splitlines()
    assert lines[0].startswith("maxsim of each row's sentence as the query")
    printed = [[float(cell) for cell in re.findall(r"(-?\d+\.\d\d)[* ]", line[52:])] for line in lines[2:]]
    assert numpy.allclose(printed, expected.numpy(), atol=0.006)


def test_sentence_transformers_trainer(tiny_model_dir, data_dir, tmp_path, recompute):
    """sentence-transformers' MultiVectorEncoderTrainer trains MultiVectorEncoder as its own (model[0], the model
    card, preprocess and forward by task): a random tiny ColBERT learns SQuAD retrieval, and a run resumed from its
    first checkpoint ends where the whole run ended."""
    from datasets import Dataset
    from sentence_transformers.multi_vector_encoder import (
        MultiVectorEncoderTrainer,
        MultiVectorEncoderTrainingArguments,
    )
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    pairs = [(paragraph["qas"][0]["question"], paragraph["context"]) for article in squad["data"]
             for paragraph in article["paragraphs"]]
    train = Dataset.from_dict({"query": [q for q, _ in pairs[:256]], "positive": [c for _, c in pairs[:256]]})
    held_out = pairs[-100:]

    def mean_reciprocal_rank(encoder) -> float:
        scores = encoder.similarity(encoder.encode_query([q for q, _ in held_out]),
                                    encoder.encode_document([c for _, c in held_out]))
        return (1 / ((scores > scores.diag()[:, None]).sum(1) + 1).float()).mean().item()

    arguments = MultiVectorEncoderTrainingArguments(
        output_dir=str(tmp_path / "run"), num_train_epochs=2, per_device_train_batch_size=16, learning_rate=1e-3,
        report_to=[], save_strategy="steps", save_steps=16, use_cpu=True, seed=0, disable_tqdm=True,
        **{recompute: True})  # recomputing activations gives the same gradients
    results = []
    for resume in (None, str(tmp_path / "run" / "checkpoint-16")):
        torch.manual_seed(0)
        encoder = MultiVectorEncoder(tiny_model_dir)
        before = mean_reciprocal_rank(encoder)
        trainer = MultiVectorEncoderTrainer(model=encoder, args=arguments, train_dataset=train,
                                            loss=MultiVectorMultipleNegativesRankingLoss(encoder))
        trainer.train(resume_from_checkpoint=resume)
        assert encoder.model.is_gradient_checkpointing
        results.append(mean_reciprocal_rank(encoder))
    assert before < 0.4 and results[0] > before + 0.25, (before, results)
    assert results[1] == pytest.approx(results[0], abs=1e-4)


POOLINGS = [{"pool_factor": 2}, {"pool_factor": 3, "num_protected_tokens": 0}, {"pool_factor": 1.5},
            {"max_tokens": 12}, {"distance_threshold": 0.25}, {"pool_factor": 2, "normalize_embeddings": False},
            {"pool_factor": 2, "tasks": ["query", "document"]}]


@pytest.mark.parametrize("options", POOLINGS, ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()))
def test_token_pooling_is_sentence_transformers(colbert_dirs, texts, options):
    """HierarchicalTokenPooling (Ward clustering of each document's token vectors, each cluster its mean) gives
    sentence-transformers' pooled vectors, in its order, on real paragraphs and reviews, whether given to the
    constructor or to encode; the roles it is not for are left alone, and sentence-transformers' own pooling
    object works as ours."""
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling as Theirs

    from bertforge.inference import HierarchicalTokenPooling

    reference = sentence_transformers.MultiVectorEncoder(str(colbert_dirs["native"]), device="cpu")
    documents, queries = texts["document"], texts["query"][:4]
    theirs = reference.encode_document(documents, token_pooling=Theirs(**options))
    pooled = MultiVectorEncoder(colbert_dirs["native"], token_pooling=HierarchicalTokenPooling(**options))
    assert_same_vectors(pooled.encode_document(documents), theirs)
    assert sum(map(len, theirs)) < sum(map(len, reference.encode_document(documents)))  # it did pool
    encoder = MultiVectorEncoder(colbert_dirs["native"])
    assert_same_vectors(encoder.encode_document(documents, token_pooling=Theirs(**options)), theirs)
    assert_same_vectors(pooled.encode_query(queries),
                        reference.encode_query(queries, token_pooling=Theirs(**options)))


def test_ward_clustering_is_scipys():
    """The clustering under token pooling, merge for merge and cluster for cluster, as scipy's linkage(..., "ward")
    and fcluster (maxclust and distance) give them, on unit vectors of real MiniLM tokens' shapes."""
    scipy_hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    from scipy.spatial.distance import squareform

    from bertforge.inference.token_pooling import flat_clusters, ward_linkage

    generator = torch.Generator().manual_seed(0)
    for n in (2, 3, 5, 17, 64):
        vectors = torch.nn.functional.normalize(torch.randn(n, 32, generator=generator), dim=-1)
        distances = (1 - vectors @ vectors.T).clamp_(0, 2).numpy()
        theirs = scipy_hierarchy.linkage(squareform(distances, checks=False), method="ward")
        ours = ward_linkage(distances)
        assert numpy.array_equal(ours, theirs)
        for count in range(1, n + 1):
            expected = numpy.unique(scipy_hierarchy.fcluster(theirs, t=count, criterion="maxclust"),
                                    return_inverse=True)[1]
            assert numpy.array_equal(flat_clusters(ours, max_clusters=count), expected), (n, count)
        for height in (0.0, 0.3, 0.9, 2.0):
            expected = numpy.unique(scipy_hierarchy.fcluster(theirs, t=height, criterion="distance"),
                                    return_inverse=True)[1]
            assert numpy.array_equal(flat_clusters(ours, threshold=height), expected), (n, height)


def test_calibrated_distance_threshold_is_sentence_transformers(colbert_dirs, texts):
    """calibrate_distance_threshold picks the threshold sentence-transformers picks for a token budget on real
    documents, and pooling with it keeps them within the budget on average."""
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling as Theirs

    from bertforge.inference import HierarchicalTokenPooling

    encoder = MultiVectorEncoder(colbert_dirs["native"])
    documents = encoder.encode_document(texts["document"])
    average = sum(map(len, documents)) / len(documents)
    for target, protected in ((average / 2, 1), (average / 4, 0), (8.0, 2)):
        ours = HierarchicalTokenPooling.calibrate_distance_threshold(documents, target_tokens=target,
                                                                     num_protected_tokens=protected)
        theirs = Theirs.calibrate_distance_threshold(documents, target_tokens=target, num_protected_tokens=protected)
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)
        pooling = HierarchicalTokenPooling(distance_threshold=ours, num_protected_tokens=protected)
        assert sum(map(len, pooling.pool(documents))) / len(documents) <= target
    assert HierarchicalTokenPooling.calibrate_distance_threshold(documents, target_tokens=average + 1) is None
    with pytest.raises(ConfigError, match="target_tokens must be at least 2"):
        HierarchicalTokenPooling.calibrate_distance_threshold(documents, target_tokens=1.0)
