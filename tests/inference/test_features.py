"""Feature extraction: each layer recipe and pooling against a direct computation, sentence-transformers parity."""

import concurrent.futures
import re
import threading

import numpy as np
import pytest
import torch

from bertforge import (
    BertforgeError,
    BertForMaskedLM,
    BertModel,
    ConfigError,
    InputError,
    SentenceEncoder,
    SparseEncoder,
)
from bertforge.batching import length_sorted_batches
from bertforge.inference import LAYER_COMBINATIONS, extract_features, pool, token_features


def direct(states, recipe):
    """The recipes spelled out by hand, independently of the table."""
    if recipe == "embeddings":
        return states[0]
    if recipe == "last":
        return states[-1]
    if recipe == "second_to_last":
        return states[-2]
    if recipe == "sum_last_four":
        return states[-1] + states[-2] + states[-3] + states[-4]
    if recipe == "concat_last_four":
        return torch.cat([states[-1], states[-2], states[-3], states[-4]][::-1], dim=-1)
    if recipe == "weighted_sum_all":
        return sum(states) / len(states)
    raise AssertionError(recipe)


@pytest.mark.parametrize("recipe", list(LAYER_COMBINATIONS))
def test_layer_recipes(minilm, tokenizer, real_sentences, recipe):
    batch = tokenizer(real_sentences[:4], padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = minilm(**batch, output_hidden_states=True).hidden_states
        features = token_features(minilm, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], recipe)
    expected = direct(states, recipe)
    assert features.shape == expected.shape
    assert torch.allclose(features, expected, atol=1e-5)


def test_pooling_over_real_tokens_only():
    hidden = torch.tensor([[[1.0, -1.0], [3.0, 5.0], [100.0, 100.0]],
                           [[2.0, 0.0], [4.0, -2.0], [6.0, 8.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(pool(hidden, mask, "cls"), torch.tensor([[1.0, -1.0], [2.0, 0.0]]))
    assert torch.equal(pool(hidden, mask, "mean"), torch.tensor([[2.0, 2.0], [4.0, 2.0]]))
    assert torch.equal(pool(hidden, mask, "max"), torch.tensor([[3.0, 5.0], [6.0, 8.0]]))


def test_sentence_transformers_parity(minilm, tokenizer, minilm_dir, sst2_dev, squad_contexts):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    texts = [text for text, _ in sst2_dev[:40]] + squad_contexts[:8]
    expected = reference.encode(texts, batch_size=16, convert_to_tensor=True, normalize_embeddings=False)
    ours = extract_features(minilm, tokenizer, texts, pooling="mean", normalize=True, batch_size=16,
                            max_length=reference.max_seq_length)
    assert (ours - expected).abs().max() < 1e-5


def test_cls_pooling_is_the_references_cls_vector(minilm, hf_minilm, tokenizer, sst2_dev, squad_contexts):
    """[CLS] pooling runs the last layer for [CLS] alone: the vectors are still transformers' [CLS] outputs."""
    texts = [text for text, _ in sst2_dev[:20]] + squad_contexts[:4]
    ours = extract_features(minilm, tokenizer, texts, pooling="cls", normalize=False, batch_size=8, max_length=256)
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        expected = hf_minilm(**batch).last_hidden_state[:, 0]
    assert (ours - expected).abs().max() < 1e-5
    second_to_last = extract_features(minilm, tokenizer, texts[:3], layers="second_to_last", pooling="cls",
                                      normalize=False)
    with torch.inference_mode():
        states = hf_minilm(**tokenizer(texts[:3], padding=True, return_tensors="pt"), output_hidden_states=True)
    assert (second_to_last - states.hidden_states[-2][:, 0]).abs().max() < 1e-5


def test_results_keep_input_order_despite_length_sorting(minilm, tokenizer, real_sentences):
    batched = extract_features(minilm, tokenizer, real_sentences, batch_size=3)
    one_by_one = torch.cat([extract_features(minilm, tokenizer, [text]) for text in real_sentences])
    assert torch.allclose(batched, one_by_one, atol=1e-5)


def test_length_sorted_batches_cover_every_index_once():
    batches = length_sorted_batches([5, 1, 9, 3, 7], batch_size=2)
    assert batches == [[2, 4], [0, 3], [1]]


def test_unknown_recipe_and_pooling(tiny_config, tokenizer):
    model = BertModel(tiny_config)
    with pytest.raises(BertforgeError, match="unknown layer recipe 'third'; choose from last, second_to_last"):
        extract_features(model, tokenizer, ["x"], layers="third")
    with pytest.raises(BertforgeError, match="unknown pooling 'median'"):
        extract_features(model, tokenizer, ["x"], pooling="median")


@pytest.mark.parametrize("recipe, width", [("last", 384), ("concat_last_four", 4 * 384)])
def test_no_texts_give_no_vectors_of_the_recipes_width_and_one_string_is_one_text(minilm, tokenizer, recipe,
                                                                                 width):
    assert extract_features(minilm, tokenizer, [], layers=recipe).shape == (0, width)
    one = extract_features(minilm, tokenizer, "A man is playing a guitar.", layers=recipe)
    assert one.shape == (1, width)
    assert torch.equal(one, extract_features(minilm, tokenizer, ["A man is playing a guitar."], layers=recipe))


def test_token_level_vectors_are_the_hidden_states_of_real_pieces(minilm, tokenizer):
    from bertforge.inference import extract_token_features
    text = "Unaffable café owners!"
    [result] = extract_token_features(minilm, tokenizer, [text], level="token")
    encoding = tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        hidden = minilm(**encoding).last_hidden_state[0]
    assert result.tokens == ["una", "##ffa", "##ble", "cafe", "owners", "!"]
    assert [text[start:end] for start, end in result.offsets] == ["Una", "ffa", "ble", "café", "owners", "!"]
    assert torch.allclose(result.vectors, hidden[1:-1], atol=1e-5)  # [CLS] and [SEP] are left out


def test_token_vectors_read_what_sentence_transformers_reads(minilm, tokenizer, minilm_dir, squad_contexts):
    # A long text is cut at the checkpoint's max_seq_length (256 for MiniLM), as its token embeddings are there.
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from bertforge.inference import extract_token_features
    reference = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    text = " ".join(squad_contexts[:3])
    [result] = extract_token_features(minilm, tokenizer, [text], level="token")
    expected = reference.encode([text], output_value="token_embeddings")[0]  # [CLS] ... [SEP]
    assert len(tokenizer(text, truncation=False)["input_ids"]) > reference.max_seq_length
    assert len(result.tokens) == reference.max_seq_length - 2
    assert (result.vectors - expected[1:-1]).abs().max() < 1e-5


def test_word_level_vectors_average_the_pieces_of_each_word(minilm, tokenizer):
    from bertforge.inference import extract_token_features
    text = "Unaffable café owners!"
    [pieces] = extract_token_features(minilm, tokenizer, [text], level="token", layers="sum_last_four")
    [words] = extract_token_features(minilm, tokenizer, [text], level="word", layers="sum_last_four")
    assert words.tokens == ["Unaffable", "café", "owners", "!"]
    assert words.offsets == [(0, 9), (10, 14), (15, 21), (21, 22)]
    assert torch.allclose(words.vectors[0], pieces.vectors[:3].mean(0), atol=1e-5)
    assert torch.allclose(words.vectors[1:], pieces.vectors[3:], atol=1e-5)


def test_an_empty_text_has_no_token_vectors(minilm, tokenizer):
    from bertforge.inference import extract_token_features
    [result] = extract_token_features(minilm, tokenizer, [""], level="word")
    assert result.tokens == [] and result.vectors.shape == (0, 384)


def test_scalar_mix_starts_uniform_and_learns_layer_weights(minilm, tokenizer, real_sentences):
    from bertforge.inference import ScalarMix
    batch = tokenizer(real_sentences[:3], padding=True, return_tensors="pt")
    args = (minilm, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], "weighted_sum_all")
    mix = ScalarMix(minilm.config.num_hidden_layers + 1)
    with torch.no_grad():
        assert torch.allclose(token_features(*args, scalar_mix=mix), token_features(*args), atol=1e-5)
        states = minilm(**batch, output_hidden_states=True).hidden_states
        mix.weights.copy_(torch.tensor([-1e4] * 6 + [0.0]))  # all weight on the last layer
        mix.gamma.fill_(2.0)
        assert torch.allclose(token_features(*args, scalar_mix=mix), 2 * states[-1], atol=1e-4)
    with pytest.raises(BertforgeError, match="a scalar mix applies to layers='weighted_sum_all'"):
        token_features(*args[:4], "last", scalar_mix=mix)


# --- long documents: windows ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wikitext_article(data_dir) -> str:
    """The first article of WikiText-2's validation split (the European lobster, 1,992 word pieces), its headings
    dropped and its paragraphs joined: a real document far longer than MiniLM's 256-token inputs."""
    lines = (data_dir / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(" = ") and not line.startswith(" = = ")]
    body = lines[starts[0] + 1:starts[1]]
    return " ".join(line.strip() for line in body if line.strip() and not line.strip().startswith("="))


def test_windowed_document_vector_is_the_token_weighted_mean_of_its_windows(wikitext_article, minilm_dir,
                                                                          hf_minilm):
    """The default model's layout (mean pooling, 256 tokens, normalised) on a long real document: windows built by
    hand with transformers' tokenizer (254 word pieces between [CLS] and [SEP], advancing by 127), run through
    transformers' BertModel; with mean pooling the token-weighted mean of the windows' means is the mean of every
    token vector of every window (a token in two windows counts twice), normalised at the end."""
    transformers = pytest.importorskip("transformers")
    from bertforge import BertTokenizer
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ids = hf_tokenizer(wikitext_article, add_special_tokens=False)["input_ids"]
    assert len(ids) > 1900
    token_vectors = []
    with torch.inference_mode():
        for start in range(0, len(ids), 127):
            window = [hf_tokenizer.cls_token_id, *ids[start:start + 254], hf_tokenizer.sep_token_id]
            token_vectors.append(hf_minilm(input_ids=torch.tensor([window])).last_hidden_state[0])
            if start + 254 >= len(ids):
                break
    expected = torch.nn.functional.normalize(torch.cat(token_vectors).mean(0), dim=-1)

    model, tokenizer = BertModel.from_pretrained(minilm_dir), BertTokenizer.from_pretrained(minilm_dir)
    short = "A lobster is a crustacean."
    vectors = extract_features(model, tokenizer, [wikitext_article, short], long_text="windows", batch_size=4)
    assert len(token_vectors) == 15
    torch.testing.assert_close(vectors[0], expected, atol=2e-5, rtol=0)
    truncated = extract_features(model, tokenizer, [wikitext_article, short])
    torch.testing.assert_close(vectors[1], truncated[1], atol=1e-6, rtol=0)  # a short text is one window
    assert float(vectors[0] @ truncated[0]) < 0.99  # the whole article, not its first 256 tokens


def test_windows_weigh_what_their_pooling_read_a_prompt_left_out(wikitext_article, minilm_dir, hf_minilm,
                                                                  tmp_path):
    """A layout that leaves its prompt out of the pooling (include_prompt false): the first window's pooled vector
    leaves out [CLS] and the prompt's pieces, and so does its weight, so that the mean pooling of the windows is
    still the mean of every token vector they read."""
    import json
    import shutil

    transformers = pytest.importorskip("transformers")
    from bertforge import BertTokenizer
    folder = tmp_path / "minilm"
    shutil.copytree(minilm_dir, folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling | {"include_prompt": False}))
    prompt = "query: "
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ids = hf_tokenizer(prompt + wikitext_article, add_special_tokens=False)["input_ids"]
    skipped = 1 + len(hf_tokenizer(prompt, add_special_tokens=False)["input_ids"])  # [CLS] and the prompt
    token_vectors = []
    with torch.inference_mode():
        for start in range(0, len(ids), 127):
            window = [hf_tokenizer.cls_token_id, *ids[start:start + 254], hf_tokenizer.sep_token_id]
            states = hf_minilm(input_ids=torch.tensor([window])).last_hidden_state[0]
            token_vectors.append(states[skipped:] if start == 0 else states)
            if start + 254 >= len(ids):
                break
    expected = torch.nn.functional.normalize(torch.cat(token_vectors).mean(0), dim=-1)
    model, tokenizer = BertModel.from_pretrained(folder), BertTokenizer.from_pretrained(folder)
    [vector] = extract_features(model, tokenizer, [wikitext_article], long_text="windows", prompt=prompt)
    torch.testing.assert_close(vector, expected, atol=2e-5, rtol=0)


def test_window_weights_count_each_windows_tokens():
    """Three windows of 4, 4 and 3 tokens, the second text one window: weighted means by hand."""
    from bertforge.inference.features import combine_windows
    pooled = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0]), torch.tensor([3.0, 3.0]), torch.tensor([5.0, 7.0])]
    combined = combine_windows(pooled, [4, 4, 3, 9], [0, 0, 0, 1], 2)
    torch.testing.assert_close(combined, torch.tensor([[(4 + 9) / 11, (8 + 9) / 11], [5.0, 7.0]]))


def test_embed_command_writes_windowed_vectors(wikitext_article, tmp_path, run_cli, minilm_dir):
    import numpy as np

    from bertforge import BertTokenizer
    source = tmp_path / "docs.txt"
    source.write_text(wikitext_article[:4000] + "\nA lobster is a crustacean.\n", encoding="utf-8")
    code, out, _ = run_cli("embed", "--input", source, "--output", tmp_path / "docs.npy", "--long-text", "windows")
    assert code == 0 and "wrote 2 vectors of size 384" in out
    model, tokenizer = BertModel.from_pretrained(minilm_dir), BertTokenizer.from_pretrained(minilm_dir)
    expected = extract_features(model, tokenizer, [wikitext_article[:4000], "A lobster is a crustacean."],
                                long_text="windows")
    assert np.allclose(np.load(tmp_path / "docs.npy"), expected.numpy(), atol=1e-5)
    code, _, err = run_cli("embed", "--input", source, "--output", tmp_path / "t.jsonl", "--level", "token",
                           "--long-text", "windows")
    assert code != 0 and "--long-text windows makes one vector per line" in err


@pytest.mark.parametrize("texts, named", [(None, "got NoneType"), ({"a text": 1}, "got dict"), ({"a text"}, "got set"),
                                          (b"a text", "got bytes: decode them first")])
def test_inputs_that_are_not_texts_are_refused(minilm, tokenizer, texts, named):
    """None gave no vectors, a dict and a set failed deep in the batching, bytes were read as a list of numbers."""
    with pytest.raises(InputError, match=re.escape(f"texts must be a string or a list of strings, {named}")):
        extract_features(minilm, tokenizer, texts)


def test_a_generator_or_a_pandas_column_of_texts_is_read_as_its_list(minilm, tokenizer, minilm_dir):
    pandas = pytest.importorskip("pandas")
    texts = ["A man is playing a guitar.", "A cat sleeps."]
    expected = extract_features(minilm, tokenizer, texts)
    assert torch.equal(extract_features(minilm, tokenizer, (text for text in texts)), expected)
    column = pandas.Series(texts, index=[7, 3])  # a DataFrame's filtered column: its labels aren't positions
    assert torch.equal(extract_features(minilm, tokenizer, column), expected)
    from bertforge import SentenceEncoder
    encoder = SentenceEncoder(str(minilm_dir))
    assert (encoder.encode(column) == encoder.encode(texts)).all()


def test_a_model_or_tokenizer_that_is_not_one_is_named(minilm, tokenizer):
    with pytest.raises(InputError, match=r"model must be a bertforge model .*got BertTokenizer \(model and tokenizer "
                                         r"swapped\?\)"):
        extract_features(tokenizer, minilm, ["a text"])
    with pytest.raises(InputError, match="model must be a bertforge model .*got NoneType"):
        extract_features(None, tokenizer, ["a text"])
    with pytest.raises(InputError, match="tokenizer must be a tokenizer .*got NoneType"):
        extract_features(minilm, None, ["a text"])


def test_max_length_0_is_refused_as_a_negative_one_is(minilm, tokenizer):
    """0 was read as "not given" and gave the untruncated vectors."""
    for max_length in (0, -5):
        with pytest.raises(BertforgeError, match=f"max_length={max_length} leaves no room for text"):
            extract_features(minilm, tokenizer, ["a text"], max_length=max_length)
    with pytest.raises(ConfigError, match="max_length must be an integer, got '8'"):
        extract_features(minilm, tokenizer, ["a text"], max_length="8")


@pytest.mark.parametrize("batch_size", [1.5, "2", None])
def test_a_batch_size_that_is_not_a_count_is_named(minilm, minilm_dir, tokenizer, batch_size):
    message = re.escape(f"batch_size must be a positive whole number, got {batch_size!r}")
    with pytest.raises(InputError, match=message):
        extract_features(minilm, tokenizer, ["a text"], batch_size=batch_size)
    with pytest.raises(InputError, match=message):
        SentenceEncoder(minilm_dir).encode(["a text"], batch_size=batch_size)


def test_numpy_integers_are_counts(minilm_dir, tmp_path):
    """A count read from a numpy array (np.int64) is one, as sentence-transformers takes it, and one kept is saved
    as the number it is."""
    encoder, texts = SentenceEncoder(minilm_dir), ["a short text", "a second, longer text", "three"]
    expected = encoder.encode(texts, batch_size=2, truncate_dim=8)
    np.testing.assert_array_equal(encoder.encode(texts, batch_size=np.int64(2), truncate_dim=np.int64(8)), expected)
    SentenceEncoder(minilm_dir, truncate_dim=np.int64(8)).save(tmp_path / "kept")
    np.testing.assert_allclose(SentenceEncoder(tmp_path / "kept").encode(texts, batch_size=2), expected, atol=1e-6)
    with pytest.raises(InputError, match=re.escape("batch_size must be a positive whole number, got True")):
        encoder.encode(texts, batch_size=True)


def test_encoder_options_of_the_wrong_type_are_named(minilm_dir):
    encoder = SentenceEncoder(minilm_dir)
    with pytest.raises(InputError, match="prompt must be a text, got 5"):
        encoder.encode(["a text"], prompt=5)
    with pytest.raises(InputError, match="prompt must be a text, got 5"):
        extract_features(encoder.model, encoder.tokenizer, ["a text"], prompt=5)
    for options, message in (({"prompts": "x"}, "SentenceEncoder: prompts must be a dict, got 'x'"),
                             ({"prompts": {"query": 5}}, "prompts must be a dict of prompt names to texts"),
                             ({"model_kwargs": 5}, "SentenceEncoder: model_kwargs must be a dict, got 5")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            SentenceEncoder(minilm_dir, **options)


def test_similarity_of_vectors_that_do_not_compare_is_named(minilm_dir, tiny_config, tokenizer):
    dense = SentenceEncoder(minilm_dir)
    vectors = dense.encode(["A cat.", "A dog."])
    failures = {
        "embeddings1 has vectors of 384 dimensions, embeddings2 of 10": lambda: dense.similarity(vectors,
                                                                                                 vectors[:, :10]),
        "embeddings1 must be one vector or a (vectors, dimensions) matrix, got shape (1, 2, 384)": lambda: (
            dense.similarity(vectors[None], vectors[None])),
        "embeddings1 must be vectors (a tensor, an array or a list of vectors), got NoneType": lambda: (
            dense.similarity(None, vectors)),
        "embeddings2 of 10": lambda: dense.similarity_pairwise(vectors, vectors[:, :10]),
    }
    sparse = SparseEncoder(BertForMaskedLM(tiny_config), tokenizer)  # a vocabulary of 99
    failures |= {
        "embeddings1 has vectors of 99 dimensions, embeddings2 of 10": lambda: sparse.similarity(
            torch.ones(2, 99).to_sparse(), torch.ones(3, 10)),
        "embeddings2 must be vectors": lambda: sparse.similarity(torch.ones(2, 99), None),
        "decode takes vectors as wide as the vocabulary (99), got 10": lambda: sparse.decode(torch.ones(10), top_k=3),
    }
    for message, call in failures.items():
        with pytest.raises(InputError, match=re.escape(message)):
            call()
    assert dense.similarity(vectors[:0], vectors).shape == (0, 2)  # no vectors are of any width


def same_answer(ours, alone) -> bool:
    if isinstance(ours, dict):
        return ours.keys() == alone.keys() and all(same_answer(ours[key], alone[key]) for key in ours)
    if isinstance(ours, (list, tuple)):
        return len(ours) == len(alone) and all(same_answer(a, b) for a, b in zip(ours, alone))
    if isinstance(ours, torch.Tensor):
        return torch.equal(ours, alone)
    if isinstance(ours, np.ndarray):
        return ours.dtype == alone.dtype and np.array_equal(ours, alone)
    return ours == alone


def test_encode_and_tokenizer_calls_another_thread_makes_meanwhile_answer_as_alone(minilm_dir, real_sentences):
    """A web app's threads share one SentenceEncoder: encode and tokenizer calls that another thread makes in the
    middle of this thread's encode (in its model's last layer, where a pre-hook waits for them) give exactly what
    they give alone, whatever options each names, and so does this thread's call: no call leaves its options,
    hooks or modes on the shared encoder, model or tokenizer. Deterministic (no timing)."""
    encoder = SentenceEncoder(minilm_dir)
    texts, tokenizer = real_sentences, encoder.tokenizer
    calls = {
        "this thread's": lambda: encoder.encode(texts, batch_size=4, normalize_embeddings=True, truncate_dim=64,
                                                prompt="query: "),
        "encode": lambda: encoder.encode(texts[::-1], batch_size=3, precision="int8"),
        "token embeddings": lambda: encoder.encode(texts[:3], output_value="token_embeddings"),
        "tokenizer": lambda: dict(tokenizer(texts[:4], texts[4:8], truncation="only_second", max_length=40,
                                            padding="max_length", return_offsets_mapping=True)),
    }
    alone = {name: call() for name, call in calls.items()}
    this_thread, meanwhile = threading.get_ident(), {}

    def call_elsewhere(module, inputs):
        if threading.get_ident() == this_thread and not meanwhile:
            meanwhile.update({name: other_thread.submit(call) for name, call in list(calls.items())[1:]})
            concurrent.futures.wait(meanwhile.values())

    with concurrent.futures.ThreadPoolExecutor(1) as other_thread:
        handle = encoder.model.encoder.layers[-1].register_forward_pre_hook(call_elsewhere)
        try:
            answers = {"this thread's": calls["this thread's"]()}
        finally:
            handle.remove()
    answers |= {name: future.result() for name, future in meanwhile.items()}
    assert answers.keys() == alone.keys()
    for name, answer in answers.items():
        assert same_answer(answer, alone[name]), name
