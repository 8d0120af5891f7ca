"""transformers' Trainer fine-tunes bertforge's models as it fine-tunes its own: on real SST-2 sentences, with the
same start, data order and arguments, it logs the same losses and ends at the same logits; gradient accumulation
divides bertforge's mean losses as it should; evaluate/predict work; the folder it saves (weights alone) loads
with config=, and a run resumed from its checkpoint ends where the uninterrupted one does."""

import csv

import pytest
import torch

from bertforge import BertConfig, BertForSequenceClassification
from bertforge.errors import ConfigError

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

TOLERANCE = 1e-4
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}  # the two runs draw no masks


class Sentences(torch.utils.data.Dataset):
    """SST-2 rows as the Trainer's examples: the tokenizer's fields and the label."""

    def __init__(self, rows, tokenizer):
        self.rows, self.tokenizer = rows, tokenizer

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        sentence, label = self.rows[index]
        return {**self.tokenizer(sentence, truncation=True, max_length=64), "labels": label}


@pytest.fixture(scope="module")
def sst2_rows(data_dir) -> list[tuple[str, int]]:
    with open(data_dir / "sst2" / "train.tsv", encoding="utf-8") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["sentence"], int(row["label"])) for row, _ in zip(rows, range(48))]


def arguments(output_dir, **overrides) -> "transformers.TrainingArguments":
    settings = dict(per_device_train_batch_size=16, per_device_eval_batch_size=16, num_train_epochs=1,
                    learning_rate=1e-4, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
                    disable_tqdm=True)
    return transformers.TrainingArguments(str(output_dir), **{**settings, **overrides})


def trained(model, rows, tokenizer, output_dir, **overrides):
    trainer = transformers.Trainer(model=model, args=arguments(output_dir, **overrides),
                                   train_dataset=Sentences(rows, tokenizer), processing_class=tokenizer,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer))
    trainer.train()
    return trainer


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def seeded_classifier(minilm_dir):
    torch.manual_seed(0)
    return BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2, **NO_DROPOUT)


def test_the_trainer_trains_bertforge_as_transformers(minilm_dir, sst2_rows, tokenizer, tmp_path):
    ours = seeded_classifier(minilm_dir)
    start = ours.classifier.weight.detach().clone()
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2, **NO_DROPOUT)
    with torch.no_grad():  # the same new head
        theirs.classifier.weight.copy_(ours.classifier.weight)
        theirs.classifier.bias.copy_(ours.classifier.bias)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    ours_trainer = trained(ours, sst2_rows, tokenizer, tmp_path / "ours")
    theirs_trainer = trained(theirs, sst2_rows, hf_tokenizer, tmp_path / "theirs")

    assert len(losses(ours_trainer)) == len(losses(theirs_trainer)) == 3
    torch.testing.assert_close(torch.tensor(losses(ours_trainer)), torch.tensor(losses(theirs_trainer)),
                               atol=TOLERANCE, rtol=0)
    assert (ours.classifier.weight - start).abs().max() > 5e-5  # it trained (3 AdamW steps of at most 1e-4)
    evaluation = Sentences(sst2_rows[:24], tokenizer)
    ours_predictions = ours_trainer.predict(evaluation)
    theirs_predictions = theirs_trainer.predict(Sentences(sst2_rows[:24], hf_tokenizer))
    assert ours_predictions.predictions.shape == (24, 2)
    torch.testing.assert_close(torch.from_numpy(ours_predictions.predictions),
                               torch.from_numpy(theirs_predictions.predictions), atol=TOLERANCE, rtol=0)
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
    resumed = transformers.Trainer(model=resumed_model, args=arguments(tmp_path / "run"),
                                   train_dataset=Sentences(sst2_rows, tokenizer), processing_class=tokenizer,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer))
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert losses(resumed)[-1] == pytest.approx(losses(trainer)[-1], abs=TOLERANCE)
    for (name, a), b in zip(model.state_dict().items(), resumed_model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=TOLERANCE, rtol=0, msg=name)
