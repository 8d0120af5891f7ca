"""Task heads and BertFor* models: logits and losses equal transformers' on the same weights, checkpoints move
both ways, a bare encoder checkpoint gets a freshly initialised head, label names survive config.json."""

import logging

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertConfig, CheckpointError, ConfigError
from bertforge.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    ClassificationHead,
    SpanHead,
    TokenClassificationHead,
)

transformers = pytest.importorskip("transformers")

# kind -> (our class, transformers' class, the head's attribute, keyword arguments for transformers' config)
KINDS = {
    "classification": (BertForSequenceClassification, "BertForSequenceClassification", "classifier",
                       {"num_labels": 3}),
    "regression": (BertForSequenceClassification, "BertForSequenceClassification", "classifier",
                   {"num_labels": 1, "problem_type": "regression"}),
    "multi_label": (BertForSequenceClassification, "BertForSequenceClassification", "classifier",
                    {"num_labels": 4, "problem_type": "multi_label_classification"}),
    "token_classification": (BertForTokenClassification, "BertForTokenClassification", "classifier",
                             {"num_labels": 5}),
    # one score per token (a scorer trained with a loss of its own): transformers loads it, with cross-entropy
    "token_scoring": (BertForTokenClassification, "BertForTokenClassification", "classifier", {"num_labels": 1}),
    "question_answering": (BertForQuestionAnswering, "BertForQuestionAnswering", "qa_outputs", {}),
}

SENTENCES = ["A gripping, beautifully shot film.", "Dull.",
             "The Broncos defeated the Panthers 24-10 to earn their third Super Bowl title."]


def labels_for(kind, attention_mask, num_labels, seed=1):
    """Random targets in the form each task takes, including the values its loss must ignore."""
    generator = torch.Generator().manual_seed(seed)
    batch, seq = attention_mask.shape
    if kind == "classification":
        return {"labels": torch.randint(0, num_labels, (batch,), generator=generator)}
    if kind == "regression":
        return {"labels": torch.rand(batch, generator=generator) * 5}
    if kind == "multi_label":  # 0/1 per label, float as transformers' BCEWithLogitsLoss takes them
        return {"labels": torch.randint(0, 2, (batch, num_labels), generator=generator).float()}
    if kind.startswith("token"):
        labels = torch.randint(0, num_labels, (batch, seq), generator=generator)
        return {"labels": labels.masked_fill(attention_mask == 0, -100)}
    # One answer truncated out of the window (position past the end: ignored), one "no answer" (-1 -> [CLS]).
    start = torch.randint(0, seq, (batch,), generator=generator)
    start[0], start[-1] = seq + 3, -1
    return {"start_positions": start, "end_positions": (start + 2).clamp(max=seq - 1)}


def logits_of(output):
    return [output.logits] if hasattr(output, "logits") else [output.start_logits, output.end_logits]


def assert_same_logits(ours, theirs, attention_mask, atol=1e-5):
    """Token-level logits are compared at real tokens: bertforge zeros the encoder output at padding."""
    for mine, reference in zip(logits_of(ours), logits_of(theirs), strict=True):
        assert mine.shape == reference.shape
        if mine.dim() > 2 or mine.shape[:2] == attention_mask.shape:
            real = attention_mask.bool()
            mine, reference = mine[real], reference[real]
        torch.testing.assert_close(mine, reference, atol=atol, rtol=0)


def run_both(ours, theirs, input_ids, attention_mask, token_type_ids, targets=None):
    targets = targets or {}
    with torch.inference_mode():
        mine = ours(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **targets)
        reference = theirs(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **targets)
    return mine, reference


def bertforge_log(caplog) -> str:
    return "\n".join(record.getMessage() for record in caplog.records if record.name == "bertforge")


def tiny_reference(kind, tiny_config, seed=0):
    _, hf_name, head, hf_labels = KINDS[kind]
    torch.manual_seed(seed)
    reference = getattr(transformers, hf_name)(transformers.BertConfig(**tiny_config.to_dict(), **hf_labels))
    with torch.no_grad():  # logits of order 1, so that the comparison means something
        getattr(reference, head).weight.normal_(0, 1)
        getattr(reference, head).bias.normal_(0, 1)
    return reference.eval()


@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_loss_match_transformers(kind, tiny_config, random_batch, tmp_path):
    reference = tiny_reference(kind, tiny_config)
    reference.save_pretrained(tmp_path)
    ours = KINDS[kind][0].from_pretrained(tmp_path)
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=4, seq_len=12)
    targets = labels_for(kind, attention_mask, reference.config.num_labels)

    mine, theirs = run_both(ours, reference, input_ids, attention_mask, token_type_ids, targets)
    assert_same_logits(mine, theirs, attention_mask)
    if kind == "question_answering":
        # The span loss normalises over every position, padding included, whose logits differ by design;
        # compare it on a batch without padding.
        attention_mask = torch.ones_like(attention_mask)
        mine, theirs = run_both(ours, reference, input_ids, attention_mask, token_type_ids, targets)
    torch.testing.assert_close(mine.loss, theirs.loss, atol=1e-5, rtol=0)

    mine, _ = run_both(ours, reference, input_ids, attention_mask, token_type_ids)
    assert mine.loss is None


@pytest.mark.parametrize("kind", ["classification", "token_classification", "question_answering"])
def test_encoder_checkpoint_initialises_the_head(kind, minilm_dir, tmp_path, caplog):
    ours_class, hf_name, head, _ = KINDS[kind]
    labels = {} if kind == "question_answering" else {"num_labels": 2}
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        ours = ours_class.from_pretrained(minilm_dir, **labels)
    log = bertforge_log(caplog)
    assert "newly initialised" in log and f"{head}.weight" in log and f"{head}.bias" in log
    weight, bias = getattr(ours, head).weight, getattr(ours, head).bias
    assert abs(weight.std().item() - 0.02) < 0.003 and abs(weight.mean().item()) < 0.003, "BERT's normal(0, 0.02)"
    assert torch.count_nonzero(bias) == 0

    ours.save_pretrained(tmp_path)
    reference = getattr(transformers, hf_name).from_pretrained(tmp_path).eval()
    encoded = transformers.AutoTokenizer.from_pretrained(minilm_dir)(SENTENCES, padding=True, return_tensors="pt")
    mine, theirs = run_both(ours, reference, encoded["input_ids"], encoded["attention_mask"],
                            encoded["token_type_ids"])
    assert_same_logits(mine, theirs, encoded["attention_mask"])


@pytest.mark.parametrize("kind", ["classification", "token_classification", "question_answering"])
def test_fine_tuned_checkpoint_loads_the_head(kind, minilm_dir, tmp_path, caplog):
    ours_class, hf_name, head, _ = KINDS[kind]
    torch.manual_seed(0)
    reference = getattr(transformers, hf_name).from_pretrained(minilm_dir).eval()
    reference.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        ours = ours_class.from_pretrained(tmp_path)
    assert head not in bertforge_log(caplog)
    assert torch.equal(getattr(ours, head).weight, getattr(reference, head).weight)

    encoded = transformers.AutoTokenizer.from_pretrained(minilm_dir)(SENTENCES, padding=True, return_tensors="pt")
    mine, theirs = run_both(ours, reference, encoded["input_ids"], encoded["attention_mask"],
                            encoded["token_type_ids"])
    assert_same_logits(mine, theirs, encoded["attention_mask"])


def test_label_names_round_trip_through_transformers(tiny_config, tmp_path):
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    BertForTokenClassification(BertConfig(**{**vars(tiny_config), "id2label": id2label})).save_pretrained(
        tmp_path / "ours")
    reference = transformers.BertForTokenClassification.from_pretrained(tmp_path / "ours")
    assert reference.config.id2label == id2label
    assert reference.config.label2id == {"O": 0, "B-PER": 1, "I-PER": 2}

    reference.config.id2label = {0: "negative", 1: "neutral", 2: "positive"}
    reference.config.label2id = {"negative": 0, "neutral": 1, "positive": 2}
    reference.save_pretrained(tmp_path / "theirs")
    ours = BertForTokenClassification.from_pretrained(tmp_path / "theirs")
    assert ours.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert ours.config.label2id == {"negative": 0, "neutral": 1, "positive": 2}


def test_label_overrides(tiny_config, tmp_path):
    named = BertConfig(**{**vars(tiny_config), "id2label": {0: "neg", 1: "neutral", 2: "pos"}})
    BertForSequenceClassification(named).save_pretrained(tmp_path)

    same_count = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert same_count.config.id2label == named.id2label, "keeps the checkpoint's names, as transformers does"
    renamed = BertForSequenceClassification.from_pretrained(tmp_path, id2label={0: "a", 1: "b", 2: "c"})
    assert renamed.config.label2id == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(CheckpointError, match=r"classifier\.(weight|bias).*expects \(5"):
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    with pytest.raises(ConfigError, match="num_labels"):
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=2, id2label={0: "x"})

    unlabelled = BertForSequenceClassification(tiny_config)
    assert unlabelled.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}, "transformers' default of two labels"
    assert tiny_config.id2label == {}, "the caller's config is not modified"
    assert BertForQuestionAnswering(named).config.id2label == {}, "span scores have no label names"


def test_head_sizes_are_checked():
    with pytest.raises(ConfigError):
        ClassificationHead(8, 0, 0.1)
    with pytest.raises(ConfigError):
        TokenClassificationHead(8, 0, 0.1)


def test_span_loss_is_transformers_loss():
    from transformers.loss.loss_utils import ForQuestionAnsweringLoss

    generator = torch.Generator().manual_seed(0)
    start_logits, end_logits = torch.randn(2, 5, 7, generator=generator).unbind(0)
    start = torch.tensor([0, 3, 7, 9, -2])  # 7 and 9 are past the end of a 7-token window
    end = torch.tensor([1, 6, 8, 2, 0])
    torch.testing.assert_close(SpanHead(4).loss((start_logits, end_logits), (start, end)),
                               ForQuestionAnsweringLoss(start_logits, end_logits, start, end))


def test_token_loss_ignores_unlabelled_tokens():
    head = TokenClassificationHead(8, 3, 0.0)
    logits = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[0, 2, -100, -100], [1, -100, 1, 0]])
    kept = labels != -100
    expected = -logits[kept].log_softmax(-1).gather(1, labels[kept][:, None]).mean()
    torch.testing.assert_close(head.loss(logits, labels), expected)


def padded_span_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Start and end logits of two examples, 6 and 4 tokens long, the second padded to 6, and their mask."""
    generator = torch.Generator().manual_seed(0)
    start_logits, end_logits = torch.randn(2, 2, 6, generator=generator).unbind(0)
    return start_logits, end_logits, torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


def test_span_loss_leaves_padding_out():
    # An example's loss is the same alone as beside a longer one that pads it: padding is no candidate position.
    start_logits, end_logits, mask = padded_span_batch()
    positions = (torch.tensor([2, 1]), torch.tensor([4, 3]))
    head = SpanHead(4)
    batch = head.loss((start_logits, end_logits), positions, mask)
    alone = [head.loss((start_logits[i:i + 1, :length], end_logits[i:i + 1, :length]),
                       (positions[0][i:i + 1], positions[1][i:i + 1])) for i, length in enumerate((6, 4))]
    torch.testing.assert_close(batch, (alone[0] + alone[1]) / 2)
    assert not torch.allclose(batch, head.loss((start_logits, end_logits), positions))


def test_a_span_position_on_padding_is_ignored_as_one_past_the_window():
    # Alone, the second example is 4 tokens long and a start at 5 is past its end (ignored, as in transformers); in a
    # batch it falls on padding and is ignored too, not scored against the lowest float (a loss of ~1e38).
    start_logits, end_logits, mask = padded_span_batch()
    positions = (torch.tensor([2, 5]), torch.tensor([4, 3]))
    batch = SpanHead(4).loss((start_logits, end_logits), positions, mask)
    # start: only the first example counts; end: both do
    start_first = F.cross_entropy(start_logits[:1], positions[0][:1])
    end_both = F.cross_entropy(end_logits.masked_fill(mask == 0, torch.finfo(torch.float32).min), positions[1])
    torch.testing.assert_close(batch, (start_first + end_both) / 2)


def test_float_targets_of_several_labels_are_multi_label_as_in_transformers(tiny_config, random_batch, tmp_path):
    reference = tiny_reference("classification", tiny_config)  # 3 labels, no problem_type
    reference.save_pretrained(tmp_path)
    ours = BertForSequenceClassification.from_pretrained(tmp_path)
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=4, seq_len=12)
    targets = labels_for("multi_label", attention_mask, 3)
    mine, theirs = run_both(ours, reference, input_ids, attention_mask, token_type_ids, targets)
    torch.testing.assert_close(mine.loss, theirs.loss, atol=1e-5, rtol=0)
    # the first labels decide the problem type for good, and the saved config.json says it, as transformers' does
    assert ours.config.problem_type == reference.config.problem_type == "multi_label_classification"
    ours.save_pretrained(tmp_path / "trained")
    assert transformers.BertForSequenceClassification.from_pretrained(
        tmp_path / "trained").config.problem_type == "multi_label_classification"
    single = BertForSequenceClassification.from_pretrained(tmp_path)
    single(input_ids, attention_mask, token_type_ids, labels=torch.tensor([0, 2, 1, 1]))
    assert single.config.problem_type == "single_label_classification"


def test_a_transformers_config_object_is_read_as_its_config_json(tiny_config):
    config = transformers.BertConfig(**tiny_config.to_dict(), num_labels=3, classifier_dropout=0.3)
    classifier, tagger = BertForSequenceClassification(config), BertForTokenClassification(config)
    assert isinstance(classifier.config, BertConfig) and classifier.config.num_labels == 3
    assert classifier.classifier.dropout.p == tagger.classifier.dropout.p == 0.3  # not hidden_dropout_prob
    assert classifier.config.to_dict()["classifier_dropout"] == 0.3
    for unsupported in ({"position_embedding_type": "relative_key"}, {"is_decoder": True}, {"hidden_act": "prelu"}):
        with pytest.raises(ConfigError, match=next(iter(unsupported))):
            BertForQuestionAnswering(transformers.BertConfig(**{**tiny_config.to_dict(), **unsupported}))


def test_label2id_alone_names_the_labels(tiny_config, tmp_path):
    tiny_reference("classification", tiny_config).save_pretrained(tmp_path)
    model = BertForSequenceClassification.from_pretrained(tmp_path, label2id={"neg": 0, "neutral": 1, "pos": 2})
    assert model.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    assert BertConfig(label2id={"b": 1, "a": 0}).id2label == {1: "b", 0: "a"}


def test_outputs_read_as_transformers_model_outputs(tiny_config, random_batch, tmp_path):
    # Code written for transformers indexes outputs: the loss first when there is one, then the set fields.
    reference = tiny_reference("classification", tiny_config)
    reference.save_pretrained(tmp_path)
    ours = BertForSequenceClassification.from_pretrained(tmp_path)
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=4, seq_len=12)
    targets = labels_for("classification", attention_mask, 3)
    mine, theirs = run_both(ours, reference, input_ids, attention_mask, token_type_ids, targets)
    assert mine.keys() == list(theirs.keys()) == ["loss", "logits"]
    loss, logits = mine[:2]
    torch.testing.assert_close(loss, theirs[0], atol=1e-5, rtol=0)
    assert mine["logits"] is mine.logits is logits and len(mine.to_tuple()) == 2
    mine, theirs = run_both(ours, reference, input_ids, attention_mask, token_type_ids)
    assert mine.keys() == list(theirs.keys()) == ["logits"] and mine[0] is mine.logits
    with pytest.raises(KeyError):
        mine["loss"]  # not set, as in transformers


def test_a_head_for_other_labels_is_refused_unless_mismatched_sizes_are_ignored(tiny_config, tmp_path, caplog):
    reference = tiny_reference("classification", tiny_config)  # 3 labels
    reference.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="'classifier.(weight|bias)' has shape"):
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        model = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert model.num_labels == 5 and "newly initialised" in bertforge_log(caplog) and "classifier.weight" in caplog.text
    torch.testing.assert_close(model.bert.embeddings.tokens.weight, reference.bert.embeddings.word_embeddings.weight)
    with pytest.raises(CheckpointError, match="has shape"):  # the encoder must still fit
        BertForSequenceClassification.from_pretrained(tmp_path, ignore_mismatched_sizes=True, hidden_size=64,
                                                      num_attention_heads=2, intermediate_size=64)



@pytest.mark.parametrize("num_labels", [0, -1, 2.0, "3", True])
def test_num_labels_must_be_a_positive_whole_number(num_labels, tiny_config, tmp_path, minilm_dir):
    """Not read as "no labels given" (0 and below became 2 labels) nor a TypeError deep in the label names."""
    from bertforge import CrossEncoder

    BertForSequenceClassification(tiny_config).save_pretrained(tmp_path)
    message = rf"num_labels must be (an integer|at least 1), got {num_labels!r}"
    for model_class in (BertForSequenceClassification, BertForTokenClassification):
        with pytest.raises(ConfigError, match=message):
            model_class.from_pretrained(tmp_path, num_labels=num_labels)
    if num_labels == 0:  # a CrossEncoder's classifier is loaded by the same from_pretrained
        with pytest.raises(ConfigError, match=message):
            CrossEncoder(minilm_dir, num_labels=num_labels)


def test_labels_that_do_not_fit_the_logits_are_one_line_errors(tiny_config, random_batch):
    """Class ids out of range (other than -100), of the wrong type or count are refused before cross-entropy's own
    errors (an IndexError, a device-side assert on a GPU); float targets of regression and multi-label still train."""
    from bertforge import BertforgeError
    from bertforge.pretraining.heads import BertForMaskedLM, BertForPreTraining

    input_ids, attention_mask, _ = random_batch(tiny_config, batch_size=2, seq_len=7)
    config = BertConfig(**{**vars(tiny_config), "id2label": {0: "a", 1: "b", 2: "c"}})
    cases = [
        (BertForSequenceClassification(config), {"labels": torch.tensor([0, 3])},
         r"label 3 is no class id: they run from 0 to 2 \(-100: ignored\)"),
        (BertForSequenceClassification(config), {"labels": torch.tensor([0.0, 1.0])},
         r"labels must be \(2,\) class ids \(int64\), one per example; got torch.float32 of shape \(2,\)"),
        (BertForSequenceClassification(config), {"labels": [0, 1]}, "labels must be a tensor, got a list"),
        (BertForSequenceClassification(config), {"labels": torch.tensor([0, 1, 1])},
         r"labels must be \(2,\) class ids \(int64\), one per example; got torch.int64 of shape \(3,\)"),
        (BertForTokenClassification(config), {"labels": torch.full((2, 7), 3)}, "label 3 is no class id"),
        (BertForTokenClassification(config), {"labels": torch.zeros(2, 8, dtype=torch.long)},
         r"labels must be \(2, 7\) class ids \(int64\), one per token; got torch.int64 of shape \(2, 8\)"),
        (BertForMaskedLM(config), {"labels": torch.full((2, 7), 99)},
         "label 99 is no token id: they run from 0 to 98"),
        (BertForMaskedLM(config), {"labels": torch.full((2, 7), 99), "masked_logits_only": True},
         "label 99 is no token id"),
        (BertForMaskedLM(config), {"labels": torch.zeros(2, 6, dtype=torch.long), "masked_logits_only": True},
         r"labels must be \(2, 7\) token ids"),
        (BertForPreTraining(config), {"labels": torch.full((2, 7), -100), "next_sentence_label": torch.tensor([0, 2])},
         "label 2 is no next-sentence id"),
    ]
    for model, targets, message in cases:
        with pytest.raises(BertforgeError, match=message) as caught:
            model(input_ids, attention_mask, **targets)
        assert "\n" not in str(caught.value)

    ignored = torch.tensor([2, -100])
    assert BertForSequenceClassification(config)(input_ids, attention_mask, labels=ignored).loss.isfinite()
    regression = BertConfig(**{**vars(tiny_config), "num_labels": 1})
    assert BertForSequenceClassification(regression)(input_ids, attention_mask,
                                                     labels=torch.tensor([0.5, 4.2])).loss.isfinite()
    # a fresh config: the models above wrote the problem type their labels decided into theirs
    multi_label = BertForSequenceClassification(BertConfig(**{**vars(tiny_config), "num_labels": 3}))
    assert multi_label(input_ids, attention_mask, labels=torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])).loss \
        .isfinite()
    assert multi_label.config.problem_type == "multi_label_classification"
