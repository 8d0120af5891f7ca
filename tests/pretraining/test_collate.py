"""The collator on real pairs: shapes and padding, padding never masked, labels only at masked positions, masks
drawn afresh each epoch yet reproducible from the saved generator, and a batch the pre-training model takes."""

import math

import numpy as np
import pytest
import torch

from bertforge import BertConfig, ConfigError
from bertforge.heads import IGNORE_INDEX
from bertforge.pretraining.collate import PretrainingCollator
from bertforge.pretraining.instances import Instance
from bertforge.pretraining.masking import MASK_PROBABILITY, Masker
from bertforge.pretraining.objectives import get_objective


@pytest.fixture(scope="module")
def instances(data_dir, tokenizer):
    """~200 real sentence pairs of very different lengths, as the instance builder lays them out."""
    with open(data_dir / "pretrain_en" / "abc_science.txt", encoding="utf-8") as handle:
        lines = [line.strip() for _, line in zip(range(420), handle) if line.strip()]
    result = []
    for index, (first, second) in enumerate(zip(lines[::2], lines[1::2])):
        encoding = tokenizer(first, second, max_length=64)
        result.append(Instance(np.array(encoding["input_ids"]), np.array(encoding["token_type_ids"]), index % 2))
    return result


def collator(tokenizer, seed=0, **options):
    return PretrainingCollator(Masker(tokenizer.vocab, "whole_word"), tokenizer.pad_token_id, seed=seed, **options)


def batches(collate, instances, size=16):
    return [collate(instances[start:start + size]) for start in range(0, len(instances), size)]


def test_shapes_and_padding(instances, tokenizer):
    chunk = instances[:16]
    lengths = torch.tensor([len(instance.input_ids) for instance in chunk])
    batch = collator(tokenizer)(chunk)
    seq = int(lengths.max())
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"}
    for name in ("input_ids", "attention_mask", "token_type_ids", "labels"):
        assert batch[name].shape == (16, seq) and batch[name].dtype == torch.long
    assert batch["next_sentence_label"].tolist() == [instance.next_sentence_label for instance in chunk]
    assert batch["attention_mask"].sum(1).tolist() == lengths.tolist()
    for row, instance in enumerate(chunk):
        assert batch["token_type_ids"][row, :lengths[row]].tolist() == instance.token_type_ids.tolist()
    assert collator(tokenizer, pad_to=64)(chunk)["input_ids"].shape == (16, 64)
    assert collator(tokenizer, pad_to_multiple_of=8)(chunk)["input_ids"].shape == (16, -(-seq // 8) * 8)
    with pytest.raises(ConfigError):
        collator(tokenizer, pad_to=8)(chunk)


def test_masking_respects_padding_and_labels(instances, tokenizer):
    chosen = real = 0
    special = set(tokenizer.all_special_ids)
    for start, batch in zip(range(0, len(instances), 16), batches(collator(tokenizer), instances)):
        padding = batch["attention_mask"] == 0
        assert (batch["input_ids"][padding] == tokenizer.pad_token_id).all()
        assert (batch["labels"][padding] == IGNORE_INDEX).all() and (batch["token_type_ids"][padding] == 0).all()
        for row, instance in enumerate(instances[start:start + 16]):
            n = len(instance.input_ids)
            original = torch.from_numpy(instance.input_ids)
            labels, ids = batch["labels"][row, :n], batch["input_ids"][row, :n]
            masked = labels != IGNORE_INDEX
            assert (labels[masked] == original[masked]).all()  # a label is the original token
            assert (ids[~masked] == original[~masked]).all()  # nothing else is touched
            assert not any(token in special for token in original[masked].tolist())
            chosen += int(masked.sum())
            real += sum(token not in special for token in original.tolist())
    # whole-word units make the draws correlated; 5 sd of independent tokens with a 2x allowance
    assert abs(chosen - real * MASK_PROBABILITY) < 10 * math.sqrt(real * MASK_PROBABILITY * (1 - MASK_PROBABILITY))


def test_masks_are_dynamic_and_resumable(instances, tokenizer):
    collate = collator(tokenizer, seed=3)
    first_epoch = batches(collate, instances)
    state = collate.state_dict()
    second_epoch = batches(collate, instances)
    differing = sum(not torch.equal(a["labels"], b["labels"]) for a, b in zip(first_epoch, second_epoch))
    assert differing == len(first_epoch)

    resumed = collator(tokenizer, seed=99)
    resumed.load_state_dict(state)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
               for a, b in zip(batches(resumed, instances), second_epoch))
    assert all(torch.equal(a["labels"], b["labels"])
               for a, b in zip(batches(collator(tokenizer, seed=3), instances), first_epoch))


def test_single_segments_have_no_pair_label(instances, tokenizer):
    singles = [Instance(instance.input_ids, np.zeros_like(instance.token_type_ids), None) for instance in instances]
    assert "next_sentence_label" not in collator(tokenizer)(singles[:4])
    with pytest.raises(ConfigError, match="mixes"):
        collator(tokenizer)(singles[:2] + instances[:2])


def test_a_batch_trains_the_pretraining_model(instances, tokenizer):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    objective = get_objective("mlm+nsp")
    output = objective.loss(objective.build_model(config), collator(tokenizer)(instances[:8]))
    assert torch.isfinite(output.loss) and output.loss > 0


def test_a_data_loader_resumes_at_the_batch_it_stopped(data_dir, tokenizer, tmp_path):
    """In the main process a DataLoader takes exactly batch_size instances per batch, so the stream's and the
    collator's states after k batches are where batch k + 1 starts."""
    from torch.utils.data import DataLoader

    from bertforge.pretraining.corpus import CorpusReader, prepare_corpus
    from bertforge.pretraining.instances import InstanceStream

    with open(data_dir / "pretrain_en" / "inaugural.txt", encoding="utf-8") as handle:
        (tmp_path / "slice.txt").write_text("".join(line for _, line in zip(range(150), handle)), encoding="utf-8")
    prepare_corpus([tmp_path / "slice.txt"], tokenizer, tmp_path / "out", progress=False)

    def loader(states=None):
        stream = InstanceStream(CorpusReader(tmp_path / "out"), 64, "sentence_order", seed=5, shuffle_tokens=2000)
        collate = collator(tokenizer, seed=5)
        if states is not None:
            stream.load_state_dict(states[0])
            collate.load_state_dict(states[1])
        return stream, collate, iter(DataLoader(stream, batch_size=8, collate_fn=collate))

    stream, collate, batches_iterator = loader()
    for _ in range(5):
        next(batches_iterator)
    states = stream.state_dict(), collate.state_dict()
    expected = [next(batches_iterator) for _ in range(3)]
    _, _, batches_iterator = loader(states)
    for batch, reference in zip([next(batches_iterator) for _ in range(3)], expected):
        assert all(torch.equal(batch[name], reference[name]) for name in reference)
