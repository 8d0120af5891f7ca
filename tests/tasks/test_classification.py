"""Classification and regression: labels, truncation and windows, answers, and real SST-2 / STS-B slices that
must learn; the saved model must give the same logits in transformers."""

import csv
import json

import pytest
import torch

from bertforge import BertConfig, BertForSequenceClassification, BertModel
from bertforge.errors import ConfigError, InputError
from bertforge.tasks.classification import ClassificationSettings, class_labels, encode, example_logits, score, windows
from bertforge.tasks.data import Columns, TextExample, row_outputs
from bertforge.tasks.finetune import FinetuneConfig, finetune, load_task_model
from bertforge.tasks.finetuned_model import FinetunedModel, evaluate
from bertforge.tasks.registry import TASKS
from bertforge.training import TrainConfig


def test_labels_are_sorted_numerically_when_they_are_integers():
    examples = lambda *labels: [TextExample("x", label=label) for label in labels]
    assert class_labels(examples("pos", "neg", "pos")) == {0: "neg", 1: "pos"}
    assert class_labels(examples("10", "2", "1")) == {0: "1", 1: "2", 2: "10"}
    with pytest.raises(InputError, match="at least two labels"):
        class_labels(examples("pos", "pos"))
    assert class_labels(examples("1.0", "0.0")) == {0: "0.0", 1: "1.0"}  # pandas' float column of classes


def test_a_split_of_one_score_is_refused(data_dir, tmp_path):
    """The Hub's STS-B test split scores every pair -1: Pearson and Spearman are undefined (NaN), and a dev set
    of them would pick a "best" model on NaN."""
    rows = list(csv.DictReader(open(data_dir / "stsb" / "dev.tsv", encoding="utf-8"), delimiter="\t",
                               quoting=csv.QUOTE_NONE))[:20]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps({"sentence1": row["sentence1"], "sentence2":
                                                             row["sentence2"], "label": -1}) + "\n" for row in rows))
    with pytest.raises(InputError, match=r"test\.jsonl, field 'label': every score is -1: a split without labels\?"):
        TASKS["regression"].read_examples(tmp_path / "test.jsonl", Columns("sentence1", "sentence2", "label"))


def test_scores_are_not_made_classes(data_dir):
    """STS-B's scores (0.000 to 5.000) as classification labels would be a class per value, as run_glue regresses
    on float labels: refused, naming --task regression."""
    stsb = TASKS["classification"].read_examples(data_dir / "stsb" / "train.tsv",
                                                 Columns("sentence1", "sentence2", "score"))
    with pytest.raises(InputError, match=r"the labels are numbers with fractions \(.*\): scores to regress on\? "
                                         r"fine-tune with --task regression"):
        class_labels(stsb[:200])


def test_truncation_is_counted_and_pairs_are_cut_longest_first(tokenizer):
    singles = [TextExample("short one", label="a"), TextExample("a much longer text " * 20, label="b")]
    features = encode(tokenizer, singles, ClassificationSettings(max_length=16), {0: "a", 1: "b"})
    assert features.truncated == 1 and features.notes == ["1 of 2 examples were truncated to max_length=16"]
    assert features.lengths() == [4, 16] and [row["labels"] for row in features.rows] == [0, 1]
    pairs = [TextExample("tiny", "and a much longer second text " * 10, label="a"), TextExample("a", "b", "b")]
    features = encode(tokenizer, pairs, ClassificationSettings(max_length=16), {0: "a", 1: "b"})
    expected = tokenizer(pairs[0].text, pairs[0].text_pair, max_length=16, truncation="longest_first")
    assert features.truncated == 1 and features.rows[0]["input_ids"] == expected["input_ids"]
    assert features.rows[0]["token_type_ids"] == expected["token_type_ids"]
    with pytest.raises(InputError, match="some examples have a second text"):
        encode(tokenizer, singles + pairs, ClassificationSettings(max_length=16), {0: "a", 1: "b"})


def test_windows_cover_the_text_with_half_overlap(tokenizer):
    text = " ".join(f"word{i}" for i in range(40))
    ids = tokenizer(text)["input_ids"][1:-1]
    pieces = windows(tokenizer, TextExample(text), max_length=12)  # 10 tokens a window, advancing by 5
    bodies = [piece[1:-1] for piece, _ in pieces]
    assert all(piece[0] == tokenizer.cls_token_id and piece[-1] == tokenizer.sep_token_id for piece, _ in pieces)
    assert bodies[0] == ids[:10] and bodies[1] == ids[5:15]
    assert bodies[-1][-1] == ids[-1] and len(bodies) == (len(ids) - 10 + 4) // 5 + 1
    with pytest.raises(ConfigError, match="too small"):
        windows(tokenizer, TextExample(text), max_length=3)


def test_pair_windows_slide_over_the_longer_text_and_keep_the_other_whole(tokenizer):
    long_text = " ".join(f"word{i}" for i in range(40))
    long_ids, short_ids = tokenizer(long_text)["input_ids"][1:-1], tokenizer("is it so?")["input_ids"][1:-1]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    # max_length 20: 3 special tokens and the 4-token short text leave windows of 13 long-text tokens, step 6
    for example, long_first in ((TextExample(long_text, "is it so?"), True), (TextExample("is it so?", long_text),
                                                                              False)):
        pieces = windows(tokenizer, example, max_length=20)
        for number, (ids, segments) in enumerate(pieces):
            window = long_ids[6 * number:6 * number + 13]
            first, second = (window, short_ids) if long_first else (short_ids, window)
            assert ids == [cls, *first, sep, *second, sep]
            assert segments == [0] * (len(first) + 2) + [1] * (len(second) + 1)
            assert len(ids) <= 20
        # the last window reaches the end of the long text, and the one before it did not
        assert 6 * (len(pieces) - 1) + 13 >= len(long_ids) > 6 * (len(pieces) - 2) + 13
    # a second text longer than half the budget is cut to half of it
    pieces = windows(tokenizer, TextExample(long_text, long_text[:60]), max_length=20)
    assert all(segments.count(1) == 17 // 2 + 1 for _, segments in pieces)


def test_window_logits_are_averaged_per_example(tokenizer):
    model = BertForSequenceClassification(BertConfig.tiny(vocab_size=tokenizer.vocab_size,
                                                          id2label={0: "a", 1: "b", 2: "c"}))
    long_text = "an example that is long enough for several windows " * 4
    examples = [TextExample(long_text), TextExample("short")]
    features = encode(tokenizer, examples, ClassificationSettings(max_length=16, long_text="windows"),
                      model.config.id2label)
    assert features.example_index.count(0) > 2 and features.example_index[-1] == 1
    logits = example_logits(features, row_outputs(model, features, 2, TASKS["classification"].outputs), len(examples))
    model.eval()
    with torch.no_grad():
        each = [model(torch.tensor([row["input_ids"]])).logits[0] for row in features.rows]
    torch.testing.assert_close(logits[0], torch.stack(each[:-1]).mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1], each[-1], rtol=1e-5, atol=1e-5)
    answers = TASKS["classification"].predict(model, features, examples)
    assert set(answers[0]["probabilities"]) == {"a", "b", "c"}
    assert sum(answers[0]["probabilities"].values()) == pytest.approx(1.0)


def test_score_uses_binary_f1_for_two_labels_and_macro_f1_otherwise():
    examples = [TextExample("x", label=label) for label in ("neg", "pos", "pos")]
    answers = [{"label": label} for label in ("neg", "neg", "pos")]
    two = score(answers, examples, {0: "neg", 1: "pos"})
    assert two == {"accuracy": pytest.approx(2 / 3), "f1": pytest.approx(2 / 3),
                   "matthews_correlation": pytest.approx(0.5)}
    assert set(score(answers, examples, {0: "neg", 1: "pos", 2: "meh"})) == {"accuracy", "macro_f1",
                                                                            "matthews_correlation"}


def test_finetune_config_round_trips_through_json(tmp_path):
    config = FinetuneConfig(train="train.tsv", output="out", task="regression", text_pair_column="sentence2",
                            settings=ClassificationSettings(long_text="windows"),
                            training=TrainConfig(lr=1e-4, betas=(0.9, 0.98), eval_every=50, lr_schedule="cosine",
                                                 layer_lr_decay=0.9, max_grad_norm=0.0))
    config.save(tmp_path / "run.json")
    assert FinetuneConfig.load(tmp_path / "run.json") == config
    with pytest.raises(ConfigError, match="unknown task 'nope'; choose from classification, regression"):
        FinetuneConfig(task="nope")
    with pytest.raises(ConfigError, match="unknown context 'paragraph'; choose from sentence, document"):
        FinetuneConfig.from_dict({"task": "ner", "context": "paragraph"})
    with pytest.raises(ConfigError, match="unknown decoding 'crf'; choose from argmax, viterbi"):
        FinetuneConfig.from_dict({"task": "ner", "decoding": "crf"})
    with pytest.raises(ConfigError, match=r"^run.json: unknown key 'epochs'"):
        FinetuneConfig.from_dict({"epochs": 3}, "run.json")  # belongs under "training"


# --- real data ------------------------------------------------------------------------------------------------

def write_tsv(path, header, rows):
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_sst2_slice_learns_well_above_chance(sst2_teacher, sst2_files):
    """The shared SST-2 model (tests/conftest.py): one epoch on 2,000 sentences; chance is 0.52 on this dev slice."""
    best = json.loads((sst2_teacher / "metrics.json").read_text())["best"]
    assert best["accuracy"] >= 0.75
    saved = json.loads((sst2_teacher / "config.json").read_text())
    assert saved["id2label"] == {"0": "0", "1": "1"} and saved["label2id"] == {"0": 0, "1": 1}
    assert evaluate(sst2_teacher, sst2_files["dev"])["accuracy"] == pytest.approx(best["accuracy"])


def test_saved_model_gives_the_same_logits_in_transformers(sst2_teacher, tokenizer):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertForSequenceClassification.from_pretrained(sst2_teacher).eval()
    ours = FinetunedModel.load(sst2_teacher).model
    batch = tokenizer(["a gripping , beautifully acted film .", "flat , dull and far too long ."], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        expected = theirs(**batch).logits
        logits = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    assert theirs.config.id2label == {0: "0", 1: "1"}


def test_stsb_regression_slice_learns(tmp_path, data_dir):
    columns = Columns("sentence1", "sentence2", "score")
    # STS-B's dev file is grouped by genre: every 7th pair mixes captions, news and forums
    dev = TASKS["regression"].read_examples(data_dir / "stsb" / "dev.tsv", columns)[::7][:200]
    config = FinetuneConfig(task="regression", train=str(data_dir / "stsb" / "train.tsv"),
                            output=str(tmp_path / "model"), text_column=columns.text,
                            text_pair_column=columns.text_pair, label_column=columns.label,
                            max_train_examples=640, settings=ClassificationSettings(max_length=64), batch_size=8,
                            training=TrainConfig(epochs=2, lr=2e-4, warmup_ratio=0.1, progress=False, device="cpu"))
    result = finetune(config, dev_examples=dev)
    # An untrained head scores ~0. The new head is drawn from the run's seed; one epoch of this 640-example slice
    # gave 0.35 with seed 42, two epochs 0.50-0.59 over seeds 42, 1 and 7.
    assert result.best["spearman"] >= 0.4
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert len(saved["id2label"]) == 1
    assert saved["problem_type"] == "regression"  # as transformers' Trainer leaves it: its pipeline applies no sigmoid


def test_random_init_keeps_the_architecture_and_draws_fresh_seeded_weights(tmp_path, tokenizer):
    """--random-init: the baseline that shows what pre-training is worth (same architecture, no pre-training)."""
    pretrained = BertModel(BertConfig.tiny(vocab_size=tokenizer.vocab_size))
    torch.nn.init.constant_(pretrained.embeddings.tokens.weight, 0.5)  # unmistakably "pre-trained"
    pretrained.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    task, labels = TASKS["classification"], {0: "neg", 1: "pos"}
    loaded = load_task_model(task, str(tmp_path), labels, random_init=False, seed=0)
    fresh, again = (load_task_model(task, str(tmp_path), labels, random_init=True, seed=0) for _ in range(2))
    assert fresh.config == loaded.config and fresh.config.id2label == labels
    assert torch.all(loaded.bert.embeddings.tokens.weight == 0.5)
    assert fresh.bert.embeddings.tokens.weight.std().item() == pytest.approx(0.02, rel=0.1)  # BERT's init
    torch.testing.assert_close(fresh.state_dict(), again.state_dict(), rtol=0, atol=0)


def test_dropout_replaces_the_checkpoints_in_both_the_pretrained_and_the_random_init_model(tmp_path, tokenizer):
    """A checkpoint pre-trained without dropout (the short-run recipe) is fine-tuned with BERT's 0.1."""
    BertModel(BertConfig.tiny(vocab_size=tokenizer.vocab_size, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)).save_pretrained(tmp_path)
    task, labels = TASKS["classification"], {0: "neg", 1: "pos"}
    for random_init in (False, True):
        model = load_task_model(task, str(tmp_path), labels, random_init=random_init, seed=0, dropout=0.1)
        assert (model.config.hidden_dropout_prob, model.config.attention_probs_dropout_prob) == (0.1, 0.1)
        assert model.classifier.dropout.p == 0.1
        kept = load_task_model(task, str(tmp_path), labels, random_init=random_init, seed=0)
        assert kept.config.hidden_dropout_prob == 0.0
    with pytest.raises(ConfigError, match="dropout must be in"):
        FinetuneConfig(dropout=1.0)


# --- long pairs: windows against a direct computation ---------------------------------------------------------

PAIR_COLUMNS = Columns("#1 String", "#2 String", "Quality")
PAIR_MAX_LENGTH = 32  # shorter than most MRPC pairs (two ~20-token sentences), so nearly every pair is windowed


def windows_by_hand(hf_tokenizer, first: str, second: str, max_length: int) -> list[tuple[list[int], list[int]]]:
    """The documented pair rule, built from transformers' tokenizer: the longer text (the first on a tie) slides
    in windows advancing by half a window; the other stays whole beside each window, or its first
    (max_length - 3) // 2 tokens when longer than that."""
    cls, sep = hf_tokenizer.cls_token_id, hf_tokenizer.sep_token_id
    texts = [hf_tokenizer(text, add_special_tokens=False)["input_ids"] for text in (first, second)]
    if sum(map(len, texts)) + 3 <= max_length:
        return [([cls, *texts[0], sep, *texts[1], sep], [0] * (len(texts[0]) + 2) + [1] * (len(texts[1]) + 1))]
    budget = max_length - 3
    windowed = 0 if len(texts[0]) >= len(texts[1]) else 1
    kept = texts[1 - windowed][:budget // 2]
    size = budget - len(kept)
    pieces, start = [], 0
    while True:
        window = texts[windowed][start:start + size]
        first_ids, second_ids = (window, kept) if windowed == 0 else (kept, window)
        pieces.append(([cls, *first_ids, sep, *second_ids, sep],
                       [0] * (len(first_ids) + 2) + [1] * (len(second_ids) + 1)))
        if start + size >= len(texts[windowed]):
            return pieces
        start += size // 2


@pytest.fixture(scope="module")
def mrpc_windows_model(tmp_path_factory, data_dir):
    """MiniLM with a pair classifier trained for a few steps on MRPC pairs cut into windows of 32 tokens."""
    folder = tmp_path_factory.mktemp("mrpc_windows")
    config = FinetuneConfig(train=str(data_dir / "mrpc" / "train.tsv"), output=str(folder / "model"),
                            text_column=PAIR_COLUMNS.text, text_pair_column=PAIR_COLUMNS.text_pair,
                            label_column=PAIR_COLUMNS.label,
                            settings=ClassificationSettings(max_length=PAIR_MAX_LENGTH, long_text="windows"),
                            max_train_examples=24, batch_size=8,
                            training=TrainConfig(max_steps=3, lr=1e-4, progress=False, device="cpu"))
    return finetune(config)


def test_pair_windows_train_predict_and_evaluate_as_a_direct_computation(mrpc_windows_model, data_dir):
    """Real MRPC pairs: every window built by hand with transformers' tokenizer and run through transformers'
    BertForSequenceClassification on the saved weights, logits averaged per pair by hand, give predict()'s
    probabilities and evaluate()'s metrics; training saw exactly the hand-built windows' count of long pairs."""
    transformers = pytest.importorskip("transformers")
    from sklearn.metrics import accuracy_score, f1_score

    from bertforge.tasks.finetuned_model import predict
    directory = mrpc_windows_model.output_dir
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(directory)
    reference = transformers.BertForSequenceClassification.from_pretrained(directory).eval()

    train = TASKS["classification"].read_examples(data_dir / "mrpc" / "train.tsv", PAIR_COLUMNS)[:24]
    long_pairs = sum(len(windows_by_hand(hf_tokenizer, e.text, e.text_pair, PAIR_MAX_LENGTH)) > 1 for e in train)
    assert long_pairs > 12
    assert f"training data: {long_pairs} of 24 examples were split into windows of max_length=32" in \
        mrpc_windows_model.notes

    dev = TASKS["classification"].read_examples(data_dir / "mrpc" / "dev.tsv", PAIR_COLUMNS)[:24]
    dev_file = directory.parent / "dev.jsonl"  # the texts hold quotes that GLUE's unquoted TSV can't write back
    dev_file.write_text("".join(json.dumps(dict(zip(["#1 String", "#2 String", "Quality"],
                                                    [e.text, e.text_pair, e.label]))) + "\n" for e in dev))
    expected = []
    with torch.no_grad():
        for example in dev:
            pieces = windows_by_hand(hf_tokenizer, example.text, example.text_pair, PAIR_MAX_LENGTH)
            logits = [reference(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([segments])).logits[0]
                      for ids, segments in pieces]
            expected.append(torch.stack(logits).mean(0).softmax(-1))
    expected = torch.stack(expected)
    answers = predict(directory, dev_file)
    assert [a["text_pair"] for a in answers] == [e.text_pair for e in dev]
    ours = torch.tensor([[a["probabilities"]["0"], a["probabilities"]["1"]] for a in answers])
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)

    predicted, gold = expected.argmax(-1).tolist(), [int(e.label) for e in dev]
    metrics = evaluate(directory, dev_file)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(gold, predicted))
    assert metrics["f1"] == pytest.approx(f1_score(gold, predicted))


def test_balanced_class_weights_are_scikit_learns(data_dir, tokenizer):
    """Counted over the rows the loss averages (SST-2 sentences; CoNLL-2003 words, each tagged on its first piece),
    the weights are scikit-learn's compute_class_weight("balanced")."""
    utils = pytest.importorskip("sklearn.utils")
    from bertforge.tasks.finetune import balanced_weights, label_counts
    from bertforge.tasks.token_classification import NerSettings

    for task_name, path, columns in (("classification", data_dir / "sst2" / "dev.tsv", Columns("sentence", None,
                                                                                                "label")),
                                     ("ner", data_dir / "conll2003" / "eng.testa", Columns("tokens", None, "tags"))):
        task = TASKS[task_name]
        examples = task.read_examples(path, columns)[:300]
        id2label = task.labels(examples)
        settings = NerSettings() if task_name == "ner" else ClassificationSettings()
        features = task.encode(tokenizer, examples, settings, id2label)
        labels = [label for row in features.rows
                  for label in (row["labels"] if isinstance(row["labels"], list) else [row["labels"]]) if label != -100]
        classes = sorted(set(labels))
        expected = utils.compute_class_weight("balanced", classes=torch.tensor(classes).numpy(), y=labels)
        weights = balanced_weights(label_counts(features, len(id2label)))
        assert [weights[c] for c in classes] == pytest.approx(list(expected)), task_name
        assert len(classes) == len(id2label) and len(set(weights)) > 1
    assert balanced_weights([3, 0, 1]) == [2 / 3, 1.0, 2.0]  # a label the data lacks keeps 1


def test_class_weights_weigh_each_term_and_the_mean(tiny_config):
    """Each row's loss times its class's weight, over the sum of those weights (torch's weighted mean)."""
    from bertforge.training.trainer import class_loss

    torch.manual_seed(0)
    tiny_config.num_labels = 3
    model = BertForSequenceClassification(tiny_config).eval()
    batch = {"input_ids": torch.randint(1, 99, (6, 7)), "labels": torch.tensor([0, 1, 2, 2, 0, 2])}
    weights = torch.tensor([2.0, 0.5, 1.0])
    with torch.no_grad():
        loss = class_loss(model, batch, class_weights=weights)
        logits = model(batch["input_ids"]).logits
    terms = [-torch.log_softmax(row, -1)[label] * weights[label] for row, label in zip(logits, batch["labels"])]
    assert loss.item() == pytest.approx((sum(terms) / weights[batch["labels"]].sum()).item(), rel=1e-6)
    with torch.no_grad():
        assert class_loss(model, batch).item() == pytest.approx(model(**batch).loss.item(), rel=1e-6)


def test_balanced_class_weights_learn_the_rare_class_of_imbalanced_sst2(data_dir, tmp_path):
    """300 positive SST-2 sentences and 30 negative ones: weighed alike, the loss is met by saying positive (so
    trained, with these settings, MiniLM said positive for every one of these 200 dev sentences: a Matthews
    correlation of 0, accuracy 0.495); balanced, the model learns the negatives too (0.30 and 0.60 here)."""
    with open(data_dir / "sst2" / "train.tsv", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    positive = [row for row in rows[1:] if row[1] == "1"][:300]
    negative = [row for row in rows[1:] if row[1] == "0"][:30]
    mixed = [row for pair in zip(positive[::10], negative) for row in pair]
    mixed += [row for i, row in enumerate(positive) if i % 10]
    write_tsv(tmp_path / "train.tsv", rows[0], mixed)
    with open(data_dir / "sst2" / "dev.tsv", encoding="utf-8") as handle:
        dev = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    write_tsv(tmp_path / "dev.tsv", dev[0], dev[1:201])
    result = finetune(FinetuneConfig(train=str(tmp_path / "train.tsv"), dev=str(tmp_path / "dev.tsv"),
                                     output=str(tmp_path / "model"), batch_size=16, class_weights="balanced",
                                     training=TrainConfig(epochs=2, lr=2e-4, warmup_ratio=0.1, progress=False,
                                                          seed=0)))
    assert result.best["matthews_correlation"] > 0.15 and result.best["accuracy"] > 0.55
    assert json.loads((tmp_path / "model" / "finetune_config.json").read_text())["class_weights"] == "balanced"
