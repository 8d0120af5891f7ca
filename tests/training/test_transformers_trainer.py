"""transformers' Trainer fine-tunes bertforge's models as it fine-tunes its own: on real SST-2, CoNLL-2003 and SQuAD
(every task head, and the masked LM), with the same start, data order and arguments, it logs the same losses and
ends at the same predictions; gradient accumulation
divides bertforge's mean losses as it should; evaluate/predict work; the folder it saves (weights alone) loads
with config=, and a run resumed from its checkpoint ends where the uninterrupted one does."""

import csv
import json

import pytest
import torch

from bertforge import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.errors import ConfigError

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

TOLERANCE = 1e-4
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}  # the two runs draw no masks


def sentences(rows, tokenizer) -> list[dict]:
    """SST-2 rows as the Trainer's examples: the tokenizer's fields and the label."""
    return [{**tokenizer(sentence, truncation=True, max_length=64), "labels": label} for sentence, label in rows]


@pytest.fixture(scope="module")
def sst2_rows(data_dir) -> list[tuple[str, int]]:
    with open(data_dir / "sst2" / "train.tsv", encoding="utf-8") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["sentence"], int(row["label"])) for row, _ in zip(rows, range(48))]


def conll_examples(data_dir, tokenizer) -> list[dict]:
    """CoNLL-2003 dev sentences, each word's tag on its first token (the rest -100), as transformers' NER recipe."""
    tags = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    sentences, words = [], []
    for line in (data_dir / "conll2003" / "eng.testa").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append(line.split())
        elif words:
            sentences.append(words)
            words = []
    examples = []
    for sentence in sentences[:32]:
        encoded = tokenizer([word for word, *_ in sentence], is_split_into_words=True, truncation=True, max_length=64)
        ids = encoded.word_ids()
        labels = [-100 if word is None or word == ids[i - 1] else tags.index(sentence[word][-1])
                  for i, word in enumerate(ids)]
        examples.append({**encoded, "labels": labels})
    return examples


def squad_examples(data_dir, tokenizer) -> list[dict]:
    """SQuAD dev questions, each in a 128-token window of its paragraph holding the first answer, with the answer's
    token span. Windows of one length, as transformers' QA recipe pads them, but with no padding: transformers puts
    padding tokens' scores in its span softmax, bertforge computes none (heads.SpanHead.loss)."""
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    examples = []
    for paragraph in (paragraph for article in squad["data"] for paragraph in article["paragraphs"]):
        question = paragraph["qas"][0]
        encoded = tokenizer(question["question"], paragraph["context"], max_length=128, truncation="only_second")
        if len(encoded["input_ids"]) < 128:
            continue
        answer = question["answers"][0]
        start = encoded.char_to_token(answer["answer_start"], sequence_index=1)
        end = encoded.char_to_token(answer["answer_start"] + len(answer["text"]) - 1, sequence_index=1)
        if start is not None and end is not None and len(examples) < 32:
            examples.append({**encoded, "start_positions": start, "end_positions": end})
    return examples


def choice_examples(sst2_rows, tokenizer) -> list[dict]:
    """SWAG's shape from SST-2: a sentence and three others; the right choice is the sentence itself again."""
    sentences = [sentence for sentence, _ in sst2_rows]
    examples = []
    for i, sentence in enumerate(sentences[:32]):
        choices = [sentences[(i + 7) % len(sentences)], sentence, sentences[(i + 13) % len(sentences)]]
        encoded = tokenizer([sentence] * 3, choices, truncation=True, max_length=64)
        examples.append({**encoded, "labels": 1})
    return examples


# head -> (bertforge's class, transformers' class name, its options, examples, the collator)
HEADS = {
    "sequence": (BertForSequenceClassification, "BertForSequenceClassification", {"num_labels": 2},
                 lambda data_dir, rows, tokenizer: sentences(rows, tokenizer),
                 lambda tokenizer: transformers.DataCollatorWithPadding(tokenizer)),
    "token": (BertForTokenClassification, "BertForTokenClassification", {"num_labels": 9},
              lambda data_dir, rows, tokenizer: conll_examples(data_dir, tokenizer),
              lambda tokenizer: transformers.DataCollatorForTokenClassification(tokenizer)),
    "span": (BertForQuestionAnswering, "BertForQuestionAnswering", {},
             lambda data_dir, rows, tokenizer: squad_examples(data_dir, tokenizer),
             lambda tokenizer: transformers.DataCollatorWithPadding(tokenizer)),
    "choice": (BertForMultipleChoice, "BertForMultipleChoice", {},
               lambda data_dir, rows, tokenizer: choice_examples(rows, tokenizer),
               lambda tokenizer: transformers.DataCollatorForMultipleChoice(tokenizer)),
    "masked_lm": (BertForMaskedLM, "BertForMaskedLM", {},
                  lambda data_dir, rows, tokenizer: [dict(tokenizer(sentence, truncation=True, max_length=64))
                                                     for sentence, _ in rows[:32]],
                  lambda tokenizer: transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)),
}


def arguments(output_dir, **overrides) -> "transformers.TrainingArguments":
    settings = dict(per_device_train_batch_size=16, per_device_eval_batch_size=16, num_train_epochs=1,
                    learning_rate=1e-4, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
                    disable_tqdm=True)
    return transformers.TrainingArguments(str(output_dir), **{**settings, **overrides})


def trainer_for(model, examples, tokenizer, output_dir, collator=None, **overrides):
    return transformers.Trainer(model=model, args=arguments(output_dir, **overrides),
                                train_dataset=examples, processing_class=tokenizer,
                                data_collator=collator or transformers.DataCollatorWithPadding(tokenizer))


def trained(model, rows, tokenizer, output_dir, **overrides):
    trainer = trainer_for(model, sentences(rows, tokenizer), tokenizer, output_dir, **overrides)
    trainer.train()
    return trainer


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def seeded_classifier(minilm_dir):
    torch.manual_seed(0)
    return BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2, **NO_DROPOUT)


@pytest.mark.parametrize("head", HEADS)
def test_the_trainer_trains_bertforge_as_transformers(head, minilm_dir, data_dir, sst2_rows, tokenizer, tmp_path):
    """The same start (bertforge's new head, saved and loaded into transformers' class), examples, masks (the
    masked-LM collator draws from the seed the Trainer sets) and arguments: the same losses step by step, and the
    same predictions after."""
    ours_class, theirs_name, options, make_examples, make_collator = HEADS[head]
    torch.manual_seed(0)
    ours = ours_class.from_pretrained(minilm_dir, **options, **NO_DROPOUT)
    ours.save_pretrained(tmp_path / "start")
    theirs = getattr(transformers, theirs_name).from_pretrained(tmp_path / "start", **NO_DROPOUT)
    start = {name: tensor.clone() for name, tensor in ours.state_dict().items()}
    examples = make_examples(data_dir, sst2_rows, tokenizer)
    assert len(examples) == 32 or head == "sequence"
    runs = []
    for name, model in (("ours", ours), ("theirs", theirs)):  # each Trainer seeds the draws as it is made
        runs.append(trainer_for(model, examples, tokenizer, tmp_path / name, make_collator(tokenizer)))
        runs[-1].train()
    ours_losses, theirs_losses = (torch.tensor(losses(trainer)) for trainer in runs)
    assert len(ours_losses) == len(theirs_losses) >= 2
    torch.testing.assert_close(ours_losses, theirs_losses, atol=TOLERANCE, rtol=0)
    assert any((tensor - start[name]).abs().max() > 5e-5 for name, tensor in ours.state_dict().items())  # it trained

    torch.manual_seed(1)  # the masked-LM collator's draws for the predictions, again the same for both
    ours_predictions = runs[0].predict(examples[:8])
    torch.manual_seed(1)
    theirs_predictions = runs[1].predict(examples[:8])
    ours_outputs, theirs_outputs = (prediction.predictions if isinstance(prediction.predictions, tuple)
                                    else (prediction.predictions,)
                                    for prediction in (ours_predictions, theirs_predictions))
    assert len(ours_outputs) == len(theirs_outputs)
    for mine, reference in zip(ours_outputs, theirs_outputs, strict=True):
        assert mine.shape == reference.shape
        if head in ("token", "masked_lm"):  # scores per token, compared where a label is (bertforge scores no padding)
            labelled = ours_predictions.label_ids != -100
            mine, reference = mine[labelled], reference[labelled]
        torch.testing.assert_close(torch.from_numpy(mine), torch.from_numpy(reference), atol=TOLERANCE, rtol=0)
    assert abs(ours_predictions.metrics["test_loss"] - theirs_predictions.metrics["test_loss"]) < TOLERANCE


def test_gradient_accumulation_divides_the_mean_losses(minilm_dir, sst2_rows, tokenizer, tmp_path):
    """Two accumulated batches of 8 are one batch of 16 (the same sentences: the same shuffled order). Plain SGD
    without clipping, so that a gradient twice too large (a mean loss not divided by the steps) moves twice as far."""
    start = seeded_classifier(minilm_dir)
    whole, accumulated = seeded_classifier(minilm_dir), seeded_classifier(minilm_dir)
    sgd = dict(optim="sgd", learning_rate=0.05, max_grad_norm=0.0, lr_scheduler_type="constant")
    trained(whole, sst2_rows, tokenizer, tmp_path / "whole", **sgd)
    trained(accumulated, sst2_rows, tokenizer, tmp_path / "accumulated", per_device_train_batch_size=8,
            gradient_accumulation_steps=2, **sgd)
    for name, before in start.named_parameters():
        step_whole = whole.get_parameter(name) - before
        step_accumulated = accumulated.get_parameter(name) - before
        torch.testing.assert_close(step_accumulated, step_whole, atol=1e-6, rtol=1e-3, msg=name)
    assert (whole.classifier.weight - start.classifier.weight).abs().max() > 1e-3  # it trained


def test_what_the_trainer_saves_loads_and_resumes(minilm_dir, sst2_rows, tokenizer, tmp_path):
    model = seeded_classifier(minilm_dir)
    trainer = trained(model, sst2_rows, tokenizer, tmp_path / "run", save_strategy="steps", save_steps=2)
    trainer.save_model(tmp_path / "final")

    # The Trainer saves a model that is not transformers' own as its weights alone: config= names the rest.
    with pytest.raises(ConfigError, match="no such config file; weights saved without one .* load with config="):
        BertForSequenceClassification.from_pretrained(tmp_path / "final")
    config = BertConfig.from_pretrained(minilm_dir, num_labels=2)
    reloaded = BertForSequenceClassification.from_pretrained(tmp_path / "final", config=config)
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name

    # Resumed from the checkpoint of step 2, the run ends where the uninterrupted one did.
    resumed_model = seeded_classifier(minilm_dir)
    resumed = trainer_for(resumed_model, sentences(sst2_rows, tokenizer), tokenizer, tmp_path / "run")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert losses(resumed)[-1] == pytest.approx(losses(trainer)[-1], abs=TOLERANCE)
    for (name, a), b in zip(model.state_dict().items(), resumed_model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=TOLERANCE, rtol=0, msg=name)


def test_the_trainer_recomputes_layers_when_asked(minilm_dir, sst2_rows, tokenizer, tmp_path, recompute):
    """TrainingArguments(activation_checkpointing=True, every_n_layers), gradient_checkpointing before transformers
    5, reaches the model (transformers 5 calls activation_checkpointing_enable) and trains the same steps."""
    plain, recomputing = seeded_classifier(minilm_dir), seeded_classifier(minilm_dir)
    expected = losses(trained(plain, sst2_rows, tokenizer, tmp_path / "plain"))
    got = losses(trained(recomputing, sst2_rows, tokenizer, tmp_path / "recomputing",
                         **{recompute: True, f"{recompute}_kwargs": {"every_n_layers": 2}}))
    assert recomputing.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    assert recomputing.bert.encoder.checkpoint_every == 2
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_bertforges_trainer_smooths_labels_and_schedules_as_transformers(head, minilm_dir, data_dir, sst2_rows,
                                                                          tokenizer, tmp_path):
    """bertforge's own Trainer with label_smoothing and a cosine schedule after a warm-up, and transformers' with
    label_smoothing_factor and lr_scheduler_type="cosine", on the same start and real examples (SST-2 sentences,
    CoNLL-2003 tags): the same losses step by step and the same weights after. One batch of every example per
    step, so that the two data orders see the same batches; the head's start is made confident, so that smoothing
    moves the losses by more than the tolerance."""
    from bertforge.training import TrainConfig, Trainer

    ours_class, theirs_name, options, make_examples, make_collator = HEADS[head]
    examples = make_examples(data_dir, sst2_rows, tokenizer)[:16]
    batch = dict(make_collator(tokenizer)(examples))
    torch.manual_seed(0)
    ours = ours_class.from_pretrained(minilm_dir, **options, **NO_DROPOUT)
    with torch.no_grad():
        ours.classifier.weight.mul_(30)
    ours.save_pretrained(tmp_path / "start")
    theirs = getattr(transformers, theirs_name).from_pretrained(tmp_path / "start", **NO_DROPOUT)
    settings = dict(epochs=3, lr=1e-4, warmup_steps=1, weight_decay=0.01, label_smoothing=0.1)
    config = TrainConfig(**settings, lr_schedule="cosine", log_every=1, output_dir=str(tmp_path / "ours"),
                         progress=False, device="cpu")
    Trainer(ours, config, [batch]).train()
    ours_losses = [record["loss"] for record in map(json.loads, (tmp_path / "ours" / "train_log.jsonl").open())]
    runner = trainer_for(theirs, examples, tokenizer, tmp_path / "theirs", make_collator(tokenizer),
                         per_device_train_batch_size=len(examples), num_train_epochs=3, learning_rate=1e-4,
                         warmup_steps=1, weight_decay=0.01, label_smoothing_factor=0.1, lr_scheduler_type="cosine")
    runner.train()
    assert len(ours_losses) == len(losses(runner)) == 3
    torch.testing.assert_close(torch.tensor(ours_losses), torch.tensor(losses(runner)), atol=TOLERANCE, rtol=0)
    for (name, mine), reference in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        torch.testing.assert_close(mine, reference, atol=TOLERANCE, rtol=0, msg=name)
    unsmoothed = ours_class.from_pretrained(tmp_path / "start")(**batch).loss.item()  # the model's own loss
    assert abs(ours_losses[0] - unsmoothed) > 0.01
