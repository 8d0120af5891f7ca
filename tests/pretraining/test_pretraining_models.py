"""BertForPreTraining / BertForMaskedLM: logits and losses equal transformers' on the same weights, checkpoints
move both ways, the decoder stays tied to the word embeddings through loading and training."""

import logging

import pytest
import torch

from bertforge import BertConfig, BertModel, CheckpointError
from bertforge.checkpoint.key_map import to_hf
from bertforge.pretraining import BertForMaskedLM, BertForPreTraining, MaskedLMHead

transformers = pytest.importorskip("transformers")

# our class -> transformers' class name; BertForMaskedLM has no pooler and no sentence-pair head.
CLASSES = {BertForPreTraining: "BertForPreTraining", BertForMaskedLM: "BertForMaskedLM"}


def hf_config(config: BertConfig):
    return transformers.BertConfig(**config.to_dict())


def masked_lm_labels(input_ids, attention_mask, seed=1):
    """Original ids at ~30% of the real positions, -100 elsewhere (padding never labelled)."""
    generator = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(input_ids.shape, generator=generator) < 0.3) & attention_mask.bool()
    chosen[:, 1] = True  # at least one label per row
    return torch.where(chosen, input_ids, torch.full_like(input_ids, -100))


def targets_for(ours_class, input_ids, attention_mask):
    targets = {"labels": masked_lm_labels(input_ids, attention_mask)}
    if ours_class is BertForPreTraining:
        targets["next_sentence_label"] = torch.tensor([0, 1, 1, 0])[:len(input_ids)]
    return targets


def randomise_output_bias(model):
    """transformers and bertforge both start the output bias at zero; random values make the comparison bite."""
    with torch.no_grad():
        bias = model.cls.predictions.bias if hasattr(model, "cls") else model.masked_lm.bias
        bias.normal_(0, 1)
    return model


def mlm_logits(output):
    return output.prediction_logits if hasattr(output, "prediction_logits") else output.logits


def assert_same_outputs(ours, reference, input_ids, attention_mask, token_type_ids, ours_class):
    with torch.inference_mode():
        mine = ours.eval()(input_ids, attention_mask, token_type_ids)
        theirs = reference.eval()(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        real = attention_mask.bool()  # bertforge zeros the encoder output at padding; compare real tokens
        torch.testing.assert_close(mlm_logits(mine)[real], mlm_logits(theirs)[real], atol=1e-5, rtol=0)
        if ours_class is BertForPreTraining:
            torch.testing.assert_close(mine.seq_relationship_logits, theirs.seq_relationship_logits,
                                       atol=1e-5, rtol=0)
        targets = targets_for(ours_class, input_ids, attention_mask)
        mine = ours(input_ids, attention_mask, token_type_ids, **targets)
        theirs = reference(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **targets)
        masked_only = ours(input_ids, attention_mask, token_type_ids, **targets, masked_logits_only=True)
    torch.testing.assert_close(mine.loss, theirs.loss, atol=1e-5, rtol=0)
    # With labels every position's logits, as transformers gives them (padding aside)...
    torch.testing.assert_close(mlm_logits(mine)[real], mlm_logits(theirs)[real], atol=1e-5, rtol=0)
    # ...or, as pre-training asks, only the masked positions': the same rows, and the same loss.
    is_masked = targets["labels"] != -100
    torch.testing.assert_close(mlm_logits(masked_only), mlm_logits(theirs)[is_masked], atol=1e-5, rtol=0)
    torch.testing.assert_close(masked_only.loss, theirs.loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("ours_class", CLASSES, ids=lambda c: c.__name__)
def test_transformers_checkpoint_loads_with_the_same_outputs(ours_class, tiny_config, random_batch, tmp_path):
    torch.manual_seed(0)
    reference = randomise_output_bias(getattr(transformers, CLASSES[ours_class])(hf_config(tiny_config)))
    reference.save_pretrained(tmp_path)
    ours = ours_class.from_pretrained(tmp_path, require_heads=True)
    assert_same_outputs(ours, reference, *random_batch(tiny_config, batch_size=4, seq_len=12), ours_class)


@pytest.mark.parametrize("ours_class", CLASSES, ids=lambda c: c.__name__)
def test_bertforge_checkpoint_loads_in_transformers_tied(ours_class, tiny_config, random_batch, tmp_path):
    torch.manual_seed(0)
    ours = randomise_output_bias(ours_class(tiny_config))
    ours.save_pretrained(tmp_path)
    reference, info = getattr(transformers, CLASSES[ours_class]).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    decoder = reference.cls.predictions.decoder
    assert decoder.weight.data_ptr() == reference.bert.embeddings.word_embeddings.weight.data_ptr()
    assert_same_outputs(ours, reference, *random_batch(tiny_config, batch_size=4, seq_len=12), ours_class)


def test_decoder_is_the_embedding_matrix(tiny_config):
    model = BertForPreTraining(tiny_config)
    names = model.state_dict()
    matrix = (tiny_config.vocab_size, tiny_config.hidden_size)
    vocab_by_hidden = [name for name, tensor in names.items() if tensor.shape == matrix]
    assert vocab_by_hidden == ["bert.embeddings.tokens.weight"], "stored once: nothing to untie, nothing to re-tie"
    assert {to_hf(name) for name in names if name.startswith(("masked_lm", "next_sentence"))} == {
        "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
        "cls.predictions.bias", "cls.seq_relationship.weight", "cls.seq_relationship.bias"}


@pytest.mark.parametrize("ours_class", CLASSES, ids=lambda c: c.__name__)
def test_a_training_step_moves_the_tied_matrix_as_in_transformers(ours_class, tiny_config, random_batch, tmp_path):
    torch.manual_seed(0)
    reference = randomise_output_bias(getattr(transformers, CLASSES[ours_class])(hf_config(tiny_config)))
    reference.save_pretrained(tmp_path)
    ours = ours_class.from_pretrained(tmp_path)
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=4, seq_len=12)
    targets = targets_for(ours_class, input_ids, attention_mask)
    for model in (ours, reference):
        model.eval()  # no dropout, so that both take the same step
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **targets).loss.backward()
        optimizer.step()
    embeddings = ours.bert.embeddings.tokens.weight
    unseen = torch.ones(tiny_config.vocab_size, dtype=torch.bool)
    unseen[input_ids.flatten()] = False
    # Ids absent from the input still moved: only the decoder (the same matrix) can have sent them gradient.
    assert embeddings.grad[unseen].abs().sum(-1).gt(0).all()
    torch.testing.assert_close(embeddings, reference.bert.embeddings.word_embeddings.weight, atol=1e-5, rtol=0)
    word_embeddings = reference.bert.embeddings.word_embeddings.weight
    assert reference.cls.predictions.decoder.weight.data_ptr() == word_embeddings.data_ptr()
    assert_same_outputs(ours, reference, input_ids, attention_mask, token_type_ids, ours_class)


def test_checkpoints_with_a_stored_decoder_copy(tmp_path, tiny_config):
    """Older checkpoints store the tied decoder (and its bias) again; the copies are checked, then dropped."""
    from safetensors.torch import load_file, save_file

    model = randomise_output_bias(BertForPreTraining(tiny_config))
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    save_file(state, tmp_path / "model.safetensors")
    loaded = BertForPreTraining.from_pretrained(tmp_path, require_heads=True)
    assert torch.equal(loaded.masked_lm.bias, model.masked_lm.bias)

    state["cls.predictions.decoder.weight"] += 1
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="cls.predictions.decoder.weight.*differs.*untied"):
        BertForPreTraining.from_pretrained(tmp_path)


def test_pre_training_checkpoint_loads_as_masked_lm_and_encoder(tmp_path, tiny_config, random_batch):
    model = randomise_output_bias(BertForPreTraining(tiny_config)).eval()
    model.save_pretrained(tmp_path)
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config)
    with torch.inference_mode():
        expected = model(input_ids, attention_mask, token_type_ids).prediction_logits
        masked_lm = BertForMaskedLM.from_pretrained(tmp_path, require_heads=True)
        torch.testing.assert_close(masked_lm(input_ids, attention_mask, token_type_ids).logits, expected)
        encoder = BertModel.from_pretrained(tmp_path)
        torch.testing.assert_close(encoder(input_ids, attention_mask, token_type_ids).pooler_output,
                                   model.bert(input_ids, attention_mask, token_type_ids).pooler_output)


def test_encoder_checkpoint_has_no_masked_lm_head(minilm_dir, caplog):
    with pytest.raises(CheckpointError) as error:
        BertForMaskedLM.from_pretrained(minilm_dir, require_heads=True)
    message = str(error.value)
    assert "\n" not in message and "BertForMaskedLM's head (cls.predictions)" in message
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        model = BertForMaskedLM.from_pretrained(minilm_dir)  # continued pre-training starts from a fresh head
    assert "newly initialised" in caplog.text and "cls.predictions.bias" in caplog.text
    assert torch.count_nonzero(model.masked_lm.bias) == 0


def test_masked_lm_head_loss_is_transformers_loss():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator)
    unlabelled = torch.rand(3, 5, generator=generator) < 0.5
    labels = torch.randint(0, 11, (3, 5), generator=generator).masked_fill(unlabelled, -100)
    expected = torch.nn.CrossEntropyLoss()(logits.view(-1, 11), labels.view(-1))
    torch.testing.assert_close(MaskedLMHead.loss(logits, labels), expected)


def test_labels_need_the_pair_label_too(tiny_config):
    model = BertForPreTraining(tiny_config)
    with pytest.raises(ValueError, match="labels and next_sentence_label"):
        model(torch.ones(1, 4, dtype=torch.long), labels=torch.ones(1, 4, dtype=torch.long))


def test_the_tuple_lines_up_with_transformers(tiny_config, random_batch, tmp_path):
    """return_dict=False (and to_tuple, and torch.jit.trace) give transformers' positions: the two losses of
    bertforge's own are read by name only."""
    torch.manual_seed(0)
    transformers.BertForPreTraining(hf_config(tiny_config)).save_pretrained(tmp_path)
    ours = BertForPreTraining.from_pretrained(tmp_path, require_heads=True)
    reference = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=4, seq_len=12)
    full = torch.ones_like(attention_mask)  # every position real: padding is zeros here, not there
    targets = targets_for(BertForPreTraining, input_ids, full)
    with torch.inference_mode():
        mine = ours(input_ids, full, token_type_ids, **targets, output_hidden_states=True, return_dict=False)
        theirs = reference(input_ids, attention_mask=full, token_type_ids=token_type_ids, **targets,
                           output_hidden_states=True, return_dict=False)
        named = ours(input_ids, full, token_type_ids, **targets)
    assert len(mine) == len(theirs) == 4
    for position in range(3):
        torch.testing.assert_close(mine[position], theirs[position], atol=1e-5, rtol=0)
    assert len(mine[3]) == len(theirs[3]) == tiny_config.num_hidden_layers + 1
    torch.testing.assert_close(named.masked_lm_loss + named.sentence_pair_loss, named.loss)
    assert named["masked_lm_loss"] is named.masked_lm_loss
