"""ELECTRA: the loss is generator MLM + 50 x discriminator BCE, replaced-token targets are right (a sample equal to
the original is real), embeddings are shared, and the discriminator saves as an ordinary BERT checkpoint."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertModel
from bertforge.pretraining import ElectraForPreTraining, electra_generator_config
from bertforge.pretraining.objectives import OBJECTIVES


def masked_batch(config, seed=0, batch_size=3, seq_len=10):
    """Padded random ids with ~30% of the real positions masked: (input_ids, attention_mask, labels)."""
    generator = torch.Generator().manual_seed(seed)
    original = torch.randint(5, config.vocab_size, (batch_size, seq_len), generator=generator)
    attention_mask = torch.ones_like(original)
    attention_mask[1:, seq_len - 3:] = 0
    chosen = (torch.rand(original.shape, generator=generator) < 0.3) & attention_mask.bool()
    chosen[:, 2] = True
    input_ids = torch.where(chosen, torch.full_like(original, 4), original) * attention_mask  # 4: [MASK]
    labels = torch.where(chosen, original, torch.full_like(original, -100))
    return input_ids, attention_mask, labels


@pytest.fixture(params=["narrow_generator", "same_width_generator"])
def electra(request, tiny_config):
    torch.manual_seed(0)
    if request.param == "narrow_generator":
        return ElectraForPreTraining(tiny_config)  # 1/4 of the width: shared embeddings through a projection
    return ElectraForPreTraining(tiny_config, dataclasses.replace(tiny_config, num_hidden_layers=1))


def test_loss_is_generator_plus_50_discriminator(electra, tiny_config):
    input_ids, attention_mask, labels = masked_batch(tiny_config)
    output = electra(input_ids, attention_mask, labels=labels, rng=torch.Generator().manual_seed(1))
    is_masked = labels != -100
    original = torch.where(is_masked, labels, input_ids)

    generator_loss = F.cross_entropy(output.generator_logits, labels[is_masked])
    replaced = output.corrupted_ids != original
    real = attention_mask.bool()
    discriminator_loss = F.binary_cross_entropy_with_logits(output.discriminator_logits[real],
                                                            replaced[real].float())
    torch.testing.assert_close(output.loss, generator_loss + 50 * discriminator_loss)
    assert torch.equal(output.replaced, replaced)
    assert torch.equal(output.corrupted_ids[~is_masked], original[~is_masked]), "only masked positions change"
    assert not output.replaced[~is_masked].any()

    output.loss.backward()
    assert electra.generator_head.dense.weight.grad.abs().sum() > 0
    assert electra.replaced_token.prediction.weight.grad.abs().sum() > 0
    assert electra.discriminator.encoder.layers[0].attention.query.weight.grad.abs().sum() > 0


def test_sampling_the_original_token_is_not_a_replacement(tiny_config):
    electra = ElectraForPreTraining(tiny_config)
    input_ids, attention_mask, labels = masked_batch(tiny_config)
    is_masked = labels != -100
    labels = labels.masked_fill(is_masked, 7)  # every masked position originally held token 7
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        electra.generator_head.bias[7] = 1e4  # the generator is certain: it samples the original token
    output = electra(input_ids, attention_mask, labels=labels, rng=rng)
    assert torch.equal(output.corrupted_ids[is_masked], labels[is_masked])
    assert not output.replaced.any()

    with torch.no_grad():
        electra.generator_head.bias[7], electra.generator_head.bias[8] = 0, 1e4  # now it always samples 8
    output = electra(input_ids, attention_mask, labels=labels, rng=rng)
    assert torch.equal(output.replaced, is_masked)


def test_sampling_follows_the_seed(electra, tiny_config):
    input_ids, attention_mask, labels = masked_batch(tiny_config)
    electra.eval()
    runs = [electra(input_ids, attention_mask, labels=labels, rng=torch.Generator().manual_seed(seed)).corrupted_ids
            for seed in (3, 3, 4)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_a_mask_per_query_and_key_counts_every_position(electra, tiny_config):
    """A mask per query and key leaves no padding out: on an unpadded batch, the all-ones (batch, seq, seq) mask gives
    what the (batch, seq) one does, and packed documents (a block-diagonal mask) score every position."""
    input_ids, _, labels = masked_batch(tiny_config)
    batch, seq = input_ids.shape
    electra.eval()

    def run(mask):
        return electra(input_ids, mask, labels=labels, rng=torch.Generator().manual_seed(1))

    flat, pairwise = run(torch.ones(batch, seq, dtype=torch.long)), run(torch.ones(batch, seq, seq, dtype=torch.long))
    assert torch.equal(flat.corrupted_ids, pairwise.corrupted_ids)
    assert torch.allclose(flat.loss, pairwise.loss, atol=1e-6)
    documents = torch.zeros(batch, seq, seq, dtype=torch.bool)
    documents[:, :4, :4] = documents[:, 4:, 4:] = True
    packed = run(documents)
    every_position = F.binary_cross_entropy_with_logits(packed.discriminator_logits, packed.replaced.float())
    assert torch.allclose(packed.discriminator_loss, every_position)


def test_generator_shares_the_embeddings(tiny_config):
    electra = ElectraForPreTraining(tiny_config)
    assert electra.generator_config.hidden_size == tiny_config.hidden_size // 4
    assert electra.generator.embeddings.shared is electra.discriminator.embeddings
    parameters = {id(p) for p in electra.parameters()}
    assert id(electra.discriminator.embeddings.tokens.weight) in parameters
    same_width = ElectraForPreTraining(tiny_config, dataclasses.replace(tiny_config, num_hidden_layers=1))
    assert same_width.generator.embeddings is same_width.discriminator.embeddings


def test_generator_config_must_share_the_vocabulary(tiny_config):
    from bertforge import ConfigError
    with pytest.raises(ConfigError, match="vocab_size"):
        ElectraForPreTraining(tiny_config, dataclasses.replace(tiny_config, vocab_size=50))
    base = electra_generator_config(dataclasses.replace(tiny_config, hidden_size=768, num_attention_heads=12,
                                                        intermediate_size=3072))
    assert (base.hidden_size, base.num_attention_heads, base.intermediate_size) == (192, 3, 768)


def test_discriminator_saves_as_a_bert_checkpoint(tmp_path, tiny_config):
    transformers = pytest.importorskip("transformers")
    electra = ElectraForPreTraining(tiny_config).eval()
    electra.discriminator.save_pretrained(tmp_path)
    input_ids, attention_mask, _ = masked_batch(tiny_config)
    with torch.inference_mode():
        expected = electra.discriminator(input_ids, attention_mask).last_hidden_state
        ours = BertModel.from_pretrained(tmp_path)(input_ids, attention_mask).last_hidden_state
        theirs = transformers.BertModel.from_pretrained(tmp_path)(input_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(theirs.last_hidden_state[real], expected[real], atol=1e-5, rtol=0)


def test_objectives_table(tiny_config):
    input_ids, attention_mask, labels = masked_batch(tiny_config)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids),
             "labels": labels, "next_sentence_label": torch.tensor([0, 1, 0])}
    for name, objective in OBJECTIVES.items():
        torch.manual_seed(0)
        model = objective.build_model(tiny_config)
        output = objective.loss(model, batch, torch.Generator().manual_seed(0))
        assert output.loss.isfinite() and output.loss > 0, name
    assert OBJECTIVES["mlm+nsp"].sentence_pairs == "next_sentence"
    assert OBJECTIVES["mlm+sop"].sentence_pairs == "sentence_order"
