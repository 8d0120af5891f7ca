"""A checkpoint holding every tensor loads without the random initialisation it would overwrite; one that leaves a
head new loads as a fully built model does, so a seed gives that head what it always gave."""

import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.checkpoint.key_map import to_hf
from bertforge.checkpoint.pretrained import load_hf_state_dict


def every_tensor(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))


def test_a_complete_checkpoint_loads_its_own_numbers_and_draws_no_random_ones(minilm_dir):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    model = BertModel.from_pretrained(minilm_dir)
    assert torch.equal(torch.get_rng_state(), before)  # the old load drew every weight, then overwrote it
    saved = load_file(minilm_dir / "model.safetensors")
    tensors = every_tensor(model)
    assert tensors and all(tensor.device.type == "cpu" and tensor.dtype == torch.float32
                           for tensor in tensors.values())
    for name, tensor in tensors.items():
        torch.testing.assert_close(tensor, saved[to_hf(name)], rtol=0, atol=0, msg=name)
    assert all(parameter.requires_grad for parameter in model.parameters())


def test_a_new_head_is_the_one_a_full_build_draws_from_the_seed(minilm_dir):
    torch.manual_seed(7)
    loaded = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    torch.manual_seed(7)
    built = BertForSequenceClassification(BertConfig.from_pretrained(minilm_dir).with_overrides(num_labels=3))
    load_hf_state_dict(built, load_file(minilm_dir / "model.safetensors"), minilm_dir,
                       BertForSequenceClassification.initialisable)
    expected = every_tensor(built)
    for name, tensor in every_tensor(loaded).items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("tied", [True, False])
def test_a_saved_masked_lm_model_reloads_tied_as_it_was(tmp_path, tied):
    """The head reads the word-embedding matrix itself, or has its own decoder: either way, saved and loaded, every
    tensor is the saved one, and a tied model's decoder is still its embedding table's memory."""
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.tiny(vocab_size=50, tie_word_embeddings=tied))
    model.save_pretrained(tmp_path)
    again = BertForMaskedLM.from_pretrained(tmp_path)
    expected = every_tensor(model)
    got = every_tensor(again)
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
    ids = torch.tensor([[2, 5, 7, 3]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model.eval()(ids).logits)
    decoder, table = again.get_output_embeddings().weight, again.bert.embeddings.tokens.weight
    assert (decoder.data_ptr() == table.data_ptr()) == tied


def test_shapes_only_leaves_real_tensors_and_other_threads_to_their_initialisers():
    from concurrent.futures import ThreadPoolExecutor

    from bertforge.checkpoint.pretrained import shapes_only

    originals = {name: getattr(torch.nn.init, name) for name in ("normal_", "uniform_", "kaiming_uniform_")}
    with shapes_only():
        skeleton = torch.nn.Linear(4, 3)
        real = torch.nn.init.normal_(torch.zeros(5, device="cpu"))
        elsewhere = ThreadPoolExecutor(1).submit(lambda: torch.nn.Linear(4, 3).weight.detach()).result()
    assert skeleton.weight.is_meta and skeleton.bias.is_meta
    assert real.device.type == "cpu" and bool((real != 0).all())
    assert elsewhere.device.type == "cpu" and bool((elsewhere != 0).all())
    assert all(getattr(torch.nn.init, name) is function for name, function in originals.items())
