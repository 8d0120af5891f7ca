"""A classifier fine-tuned briefly on a real SST-2 slice: explanations are tested on a model that learned something."""

from __future__ import annotations

import csv

import pytest
import torch

from bertforge import BertForSequenceClassification, BertTokenizer

SST2_LABELS = {0: "negative", 1: "positive"}


@pytest.fixture(scope="session")
def sst2_classifier_dir(data_dir, minilm_dir, tmp_path_factory):
    """MiniLM with a classification head trained on 512 SST-2 training phrases, saved as a model directory.

    Only the head learns (on the encoder's pooled vectors, computed once): full fine-tuning costs minutes on a
    shared CPU, and the explanations run through the whole network either way.
    """
    with open(data_dir / "sst2" / "train.tsv", encoding="utf-8") as handle:
        rows = [(row["sentence"], int(row["label"]))
                for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
                if len(row["sentence"].split()) >= 5][:512]
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, id2label=SST2_LABELS).eval()
    texts, labels = zip(*rows)
    with torch.inference_mode():
        pooled = torch.cat([model.bert(**tokenizer(list(texts[i:i + 64]), padding=True, return_tensors="pt")
                                       ).pooler_output for i in range(0, len(texts), 64)])
    labels = torch.tensor(labels)
    optimizer = torch.optim.AdamW(model.classifier.parameters(), lr=1e-2)
    for _ in range(300):
        loss = model.classifier.loss(model.classifier(pooled.clone()), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    directory = tmp_path_factory.mktemp("sst2-classifier")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def sst2_classifier(sst2_classifier_dir):
    return BertForSequenceClassification.from_pretrained(sst2_classifier_dir).eval()
