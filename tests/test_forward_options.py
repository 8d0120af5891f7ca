"""The forward options transformers users pass, on the real MiniLM checkpoint against transformers: every layer's
hidden states and attention weights from each task model, flags set once at loading, token vectors in the place of
ids, and tuples for code that unpacks them."""

import inspect
import warnings

import pytest
import torch
import torch.nn.utils.prune
import transformers

from bertforge import (
    BertConfig,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.errors import BertforgeError
from bertforge.pretraining.heads import BertForMaskedLM, BertForPreTraining

TOLERANCE = 1e-5

# bertforge class -> transformers class of the same name
TASK_MODELS = {
    BertForSequenceClassification: transformers.BertForSequenceClassification,
    BertForTokenClassification: transformers.BertForTokenClassification,
    BertForQuestionAnswering: transformers.BertForQuestionAnswering,
    BertForMaskedLM: transformers.BertForMaskedLM,
}


@pytest.fixture(scope="module")
def batch(tokenizer, real_sentences):
    return tokenizer(real_sentences[:6], padding=True, truncation=True, max_length=96, return_tensors="pt")


@pytest.mark.parametrize("ours_class", list(TASK_MODELS), ids=lambda cls: cls.__name__)
def test_task_models_return_every_layer_as_transformers_does(ours_class, minilm_dir, batch, tmp_path):
    torch.manual_seed(0)
    # set at loading, as `AutoModel.from_pretrained(name, output_hidden_states=True)`
    ours = ours_class.from_pretrained(minilm_dir, output_hidden_states=True, output_attentions=True)
    ours.save_pretrained(tmp_path)  # the head each initialised, for the reference to load
    reference = TASK_MODELS[ours_class].from_pretrained(tmp_path, output_hidden_states=True, output_attentions=True,
                                                        attn_implementation="eager").eval()
    with torch.inference_mode():
        mine, theirs = ours(**batch), reference(**batch)
    assert list(mine.keys()) == [key for key in theirs.keys() if key != "cross_attentions"]
    real = batch["attention_mask"].bool()
    assert len(mine.hidden_states) == len(theirs.hidden_states) == 7
    for layer, (a, b) in enumerate(zip(mine.hidden_states, theirs.hidden_states)):
        assert (a - b)[real].abs().max() < TOLERANCE, f"hidden state {layer}"
    assert len(mine.attentions) == 6
    for layer, (a, b) in enumerate(zip(mine.attentions, theirs.attentions)):
        queries = real[:, None, :].expand(a.shape[:3])  # bertforge computes no padding query
        assert (a - b)[queries].abs().max() < TOLERANCE, f"attention weights of layer {layer}"
    # the head's output too (logits, start scores): at the real positions of per-token ones
    first, reference_first = mine.to_tuple()[0], theirs.to_tuple()[0]
    rows = real if first.dim() > 1 and first.shape[1] == real.shape[1] else slice(None)
    assert (first - reference_first)[rows].abs().max() < 1e-4

    with torch.inference_mode():  # the call's own flags win over the config's
        plain = ours(**batch, output_hidden_states=False, output_attentions=False)
    assert plain.hidden_states is None and plain.attentions is None
    assert ours.config.output_hidden_states and ours.config.output_attentions


def test_a_sequence_classifier_asked_for_hidden_states_still_matches(minilm_dir, batch):
    """Asking for every layer turns off the last layer's [CLS]-only shortcut; the logits must not move."""
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    with torch.inference_mode():
        fast = model(**batch)
        full = model(**batch, output_hidden_states=True)
    assert full.hidden_states[-1].shape == (*batch["input_ids"].shape, 384)
    assert (fast.logits - full.logits).abs().max() < TOLERANCE


def test_inputs_embeds_give_what_the_ids_give(minilm, hf_minilm, batch):
    vectors = minilm.get_input_embeddings()(batch["input_ids"])
    mask = batch["attention_mask"]
    with torch.inference_mode():
        from_vectors = minilm(inputs_embeds=vectors, attention_mask=mask, token_type_ids=batch["token_type_ids"])
        from_ids = minilm(**batch)
        reference = hf_minilm(inputs_embeds=vectors, attention_mask=mask)
    real = mask.bool()
    assert (from_vectors.last_hidden_state - from_ids.last_hidden_state)[real].abs().max() < TOLERANCE
    assert (from_vectors.last_hidden_state - reference.last_hidden_state)[real].abs().max() < TOLERANCE
    assert (from_vectors.pooler_output - reference.pooler_output).abs().max() < TOLERANCE


@pytest.mark.parametrize("ours_class", [BertModel, *TASK_MODELS, BertForPreTraining], ids=lambda cls: cls.__name__)
def test_inputs_come_in_transformers_order(ours_class):
    """Code that passes the inputs by position gets them where transformers' order puts them: ids, mask, segments,
    positions, vectors, then the targets (among the arguments both classes take)."""
    ours = list(inspect.signature(ours_class.forward).parameters)
    theirs = list(inspect.signature(getattr(transformers, ours_class.__name__).forward).parameters)
    assert ours[:6] == theirs[:6] == ["self", "input_ids", "attention_mask", "token_type_ids", "position_ids",
                                      "inputs_embeds"]
    assert [name for name in ours if name in theirs] == [name for name in theirs if name in ours]


def test_inputs_embeds_by_position(minilm, batch):
    vectors = minilm.get_input_embeddings()(batch["input_ids"])
    with torch.inference_mode():
        by_position = minilm(None, batch["attention_mask"], batch["token_type_ids"], None, vectors)
        from_ids = minilm(**batch)
    real = batch["attention_mask"].bool()
    assert (by_position.last_hidden_state - from_ids.last_hidden_state)[real].abs().max() < TOLERANCE


def test_inputs_embeds_carry_gradients_to_the_vectors(minilm_dir, batch):
    """What attribution and adversarial training use them for: d(logit)/d(token vector)."""
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir)
    vectors = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_()
    logits = model(inputs_embeds=vectors, attention_mask=batch["attention_mask"]).logits
    logits[:, 1].sum().backward()
    real = batch["attention_mask"].bool()
    assert vectors.grad[real].abs().sum(-1).min() > 0  # every real token moves the logit
    assert vectors.grad[~real].abs().max() == 0  # padding is never read


@pytest.mark.parametrize("ours_class", [BertModel, BertForSequenceClassification, BertForTokenClassification],
                         ids=lambda cls: cls.__name__)
def test_hidden_states_and_attentions_are_on_the_gradient_path(ours_class, minilm_dir, batch, tmp_path):
    """transformers' retain_grad check on a padded (packed) batch: every layer's returned state and attention
    weights get the gradient of the first output (at real tokens: transformers' padding positions hold values too),
    the same as transformers' at real tokens."""
    torch.manual_seed(0)
    ours = ours_class.from_pretrained(minilm_dir)
    ours.save_pretrained(tmp_path)
    theirs = getattr(transformers, ours_class.__name__).from_pretrained(tmp_path, attn_implementation="eager")
    real = batch["attention_mask"].bool()
    gradients = []
    for model in (ours.train(False), theirs.eval()):
        outputs = model(**batch, output_hidden_states=True, output_attentions=True)
        for tensor in (*outputs.hidden_states, *outputs.attentions):
            tensor.retain_grad()
        first = outputs[0]
        (first * real[..., None] if first.dim() == 3 else first).sum().backward()
        gradients.append(outputs)
    mine, reference = gradients
    assert mine[0] is mine.hidden_states[-1] or ours_class is not BertModel  # the last state is the output itself
    for layer, (a, b) in enumerate(zip(mine.hidden_states, reference.hidden_states)):
        assert a.grad is not None, f"hidden state {layer}"
        assert (a.grad - b.grad)[real].abs().max() < 1e-4 * b.grad[real].abs().max(), f"hidden state {layer}"
    for layer, attention in enumerate(mine.attentions):
        assert attention.grad is not None and attention.grad.abs().sum() > 0, f"attention {layer}"


def test_return_dict_false_gives_tuples_in_transformers_order(minilm_dir, batch):
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir)
    labels = torch.tensor([0, 1, 1, 0, 1, 0])
    with torch.inference_mode():
        as_output = model(**batch, labels=labels)
        loss, logits = model(**batch, labels=labels, return_dict=False)
        last, pooled = model.bert(**batch, return_dict=False)
    assert torch.equal(loss, as_output.loss) and torch.equal(logits, as_output.logits)
    assert last.shape == (*batch["input_ids"].shape, 384) and pooled.shape == (6, 384)


def test_wrong_inputs_are_named(minilm, batch):
    ids = batch["input_ids"]
    with pytest.raises(BertforgeError, match="input_ids or inputs_embeds"):
        minilm(ids, inputs_embeds=torch.zeros(*ids.shape, 384))
    with pytest.raises(BertforgeError, match="input_ids or inputs_embeds"):
        minilm()
    with pytest.raises(BertforgeError, match=r"inputs_embeds must be \(batch, seq, 384\)"):
        minilm(inputs_embeds=torch.zeros(2, 5, 100))
    with pytest.raises(BertforgeError, match="attention_mask has shape"):
        minilm(inputs_embeds=torch.zeros(2, 5, 384), attention_mask=torch.ones(2, 4))


def test_output_flags_round_trip_through_config_json(tmp_path):
    config = BertConfig.tiny(output_hidden_states=True)
    config.save(tmp_path / "config.json")
    loaded = BertConfig.load(tmp_path / "config.json")
    assert loaded.output_hidden_states and not loaded.output_attentions
    reference = transformers.BertConfig.from_pretrained(tmp_path)
    assert reference.output_hidden_states is True


def test_one_row_of_positions_or_segments_serves_the_batch(minilm, hf_minilm, batch):
    """position_ids / token_type_ids given for one row, (1, seq) or (seq,), apply to every row, as transformers
    broadcasts them: here positions counted from 2 (as after a 2-token prefix), against transformers."""
    seq = batch["input_ids"].shape[1]
    shifted = torch.arange(2, seq + 2)
    real = batch["attention_mask"].bool()
    with torch.inference_mode():
        reference = hf_minilm(**batch, position_ids=shifted[None]).last_hidden_state
        for row in (shifted[None], shifted):
            ours = minilm(**batch, position_ids=row).last_hidden_state
            assert (ours - reference)[real].abs().max() < TOLERANCE
        segments = minilm(batch["input_ids"], batch["attention_mask"], torch.zeros(seq, dtype=torch.long))
        assert (segments.last_hidden_state - minilm(**batch).last_hidden_state)[real].abs().max() == 0
    with pytest.raises(BertforgeError, match="position_ids has shape"):
        minilm(**batch, position_ids=torch.arange(seq + 1))


def test_what_transformers_code_asks_of_a_model(minilm_dir):
    """get_output_embeddings (the matrix a masked-LM head scores against, None without one), config_class,
    config.use_return_dict and the modules a device map keeps whole, as transformers' models answer."""
    accelerate = pytest.importorskip("accelerate")
    for ours_class in (BertModel, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification):
        ours = ours_class.from_pretrained(minilm_dir)
        theirs = getattr(transformers, ours_class.__name__).from_pretrained(minilm_dir)
        mine, reference = ours.get_output_embeddings(), theirs.get_output_embeddings()
        assert (mine is None) == (reference is None), ours_class.__name__
        if mine is not None:
            assert torch.equal(mine.weight, reference.weight)
            assert mine.weight is ours.get_input_embeddings().weight  # tied, as config.json says
        assert ours.config_class is BertConfig
        assert ours.config.use_return_dict is theirs.config.use_return_dict is True
    model = BertModel.from_pretrained(minilm_dir)
    layer_bytes, embedding_bytes = (sum(p.numel() * 4 for p in module.parameters())
                                    for module in (model.encoder.layers[0], model.embeddings))
    budget = {"cpu": embedding_bytes + int(2.5 * layer_bytes), "disk": 10**10}  # the rest goes to disk
    device_map = accelerate.infer_auto_device_map(model, max_memory=budget,
                                                  no_split_module_classes=model._no_split_modules)
    layers = [name for name in device_map if name.startswith("encoder.layers.")]
    assert set(device_map.values()) == {"cpu", "disk"}
    assert layers and all(name.count(".") == 2 for name in layers)  # whole layers, never split


@pytest.mark.parametrize("ours_class", [BertModel, BertForSequenceClassification, BertForTokenClassification],
                         ids=lambda cls: cls.__name__)
def test_a_traced_model_serves_other_batches(ours_class, minilm_dir, tokenizer, real_sentences, tmp_path):
    """torch.jit.trace (transformers' TorchScript recipe) records tuples and no packing, so the graph traced on one
    batch gives on batches of other sizes, lengths and padding (left padding too) what the model gives eagerly, and
    what transformers' model of the same weights gives."""
    torch.manual_seed(0)
    ours = ours_class.from_pretrained(minilm_dir).eval()
    ours.save_pretrained(tmp_path)
    reference = getattr(transformers, ours_class.__name__).from_pretrained(tmp_path).eval()
    names = ("input_ids", "attention_mask", "token_type_ids")
    example = tokenizer(real_sentences[:2], padding=True, return_tensors="pt")
    with torch.inference_mode():
        traced = torch.jit.trace(ours, tuple(example[name] for name in names))
        for texts, side in ((real_sentences[2:7], "right"), (real_sentences[7:8], "right"),
                            (real_sentences[:2], "right"), (real_sentences[2:7], "left")):
            batch = tokenizer(texts, padding=True, padding_side=side, return_tensors="pt")
            recorded = traced(*(batch[name] for name in names))
            assert isinstance(recorded, tuple)
            eager, theirs = ours(**batch).to_tuple()[0], reference(**batch).to_tuple()[0]
            rows = batch["attention_mask"].bool() if eager.dim() == 3 else slice(None)
            assert (recorded[0] - eager)[rows].abs().max() < TOLERANCE
            assert (recorded[0] - theirs)[rows].abs().max() < 1e-4


def packed_documents(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]]]:
    """The texts' tokens side by side in one row, each document attending to itself alone (a block-diagonal mask
    per query and key, (1, seq, seq)) and counting its positions from 0: what sequence packing for training does."""
    documents = [tokenizer(text)["input_ids"] for text in texts]
    length = sum(map(len, documents))
    mask = torch.zeros(1, length, length, dtype=torch.bool)
    start, positions = 0, []
    for document in documents:
        mask[0, start:start + len(document), start:start + len(document)] = True
        positions += range(len(document))
        start += len(document)
    return torch.tensor([sum(documents, [])]), mask, torch.tensor([positions]), documents


def mask_forms(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """One (batch, seq, seq) boolean mask in each form a model takes: 3-D 0/1 and bool, transformers' 4-D bool and
    its 4-D additive bias, and 4-D with a row per head."""
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)[:, None]
    return {"3-D 0/1": mask.long(), "3-D bool": mask, "4-D bool": mask[:, None], "4-D additive": additive,
            "4-D per head": mask[:, None].expand(-1, 12, -1, -1)}


def test_packed_documents_attend_as_each_document_alone_and_as_transformers(minilm, hf_minilm, tokenizer,
                                                                          real_sentences):
    """A mask per query and key, in every form: the packed documents' vectors are those of each document run alone,
    and transformers' on its 4-D masks, at every position."""
    texts = [real_sentences[0], real_sentences[6][:300], real_sentences[2]]
    ids, mask, positions, documents = packed_documents(tokenizer, texts)
    # a second row holding the same documents in the other order
    order = list(range(len(texts)))[::-1]
    ids2, mask2, positions2, _ = packed_documents(tokenizer, [texts[i] for i in order])
    ids, mask, positions = torch.cat([ids, ids2]), torch.cat([mask, mask2]), torch.cat([positions, positions2])
    with torch.inference_mode():
        alone = [minilm(torch.tensor([document])).last_hidden_state[0] for document in documents]
        expected = [torch.cat(alone), torch.cat([alone[i] for i in order])]
        forms = mask_forms(mask)
        # transformers' eager attention reads a 4-D mask as a bias only (a bool one is added as 0 and 1), so the
        # reference is given the bias
        reference = hf_minilm(input_ids=ids, attention_mask=forms["4-D additive"],
                              position_ids=positions).last_hidden_state
        for form, given in forms.items():
            ours = minilm(ids, given, position_ids=positions).last_hidden_state
            for row in range(2):
                assert (ours[row] - expected[row]).abs().max() < TOLERANCE, form
            assert (ours - reference).abs().max() < TOLERANCE, form


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_position_ids_alone_keep_packed_documents_apart_as_in_transformers(minilm, minilm_dir, tokenizer,
                                                                         real_sentences, attn_implementation):
    """transformers 5 reads position_ids given without an attention_mask as documents packed into rows (its
    DataCollatorWithFlattening's batches): a new document wherever a position is not the one before it plus one.
    Each document then gets the vectors it gets alone; a row of one document, and any row given an attention_mask
    (which says nothing of documents), attends whole. Against transformers at every position."""
    reference = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation=attn_implementation).eval()
    texts = [real_sentences[0], real_sentences[6][:300], real_sentences[2]]
    ids, _, positions, documents = packed_documents(tokenizer, texts)
    order = [2, 1, 0]
    reordered, _, reordered_positions, _ = packed_documents(tokenizer, [texts[i] for i in order])
    # the same documents in the other order, and the first row again as one document (positions counting on)
    ids = torch.cat([ids, reordered, ids])
    positions = torch.cat([positions, reordered_positions, torch.arange(ids.shape[1])[None]])
    with torch.inference_mode():
        alone = [minilm(torch.tensor([document])).last_hidden_state[0] for document in documents]
        ours = minilm(ids, position_ids=positions)
        theirs = reference(input_ids=ids, position_ids=positions)
        whole = minilm(ids, torch.ones_like(ids), position_ids=positions)
        theirs_whole = reference(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions)
        one_document = minilm(ids[2:]).last_hidden_state[0]
    assert (ours.last_hidden_state[0] - torch.cat(alone)).abs().max() < TOLERANCE
    assert (ours.last_hidden_state[1] - torch.cat([alone[i] for i in order])).abs().max() < TOLERANCE
    assert (ours.last_hidden_state[2] - one_document).abs().max() < TOLERANCE
    assert (whole.last_hidden_state[0] - torch.cat(alone)).abs().max() > 0.1  # the documents see each other
    for mine, reference_output in ((ours, theirs), (whole, theirs_whole)):
        assert (mine.last_hidden_state - reference_output.last_hidden_state).abs().max() < TOLERANCE
        assert (mine.pooler_output - reference_output.pooler_output).abs().max() < TOLERANCE


@pytest.mark.parametrize("ours_class", [BertForSequenceClassification, BertForMultipleChoice,
                                        BertForNextSentencePrediction], ids=lambda cls: cls.__name__)
def test_first_token_heads_read_a_padding_first_position_as_transformers_does(ours_class, minilm_dir, tokenizer,
                                                                             real_sentences, tmp_path):
    """The heads that read [CLS] (through the pooler), on left padding and on a mask with 0 at the first position:
    transformers computes that position (it attends to the row's real keys) and reads it, so logits and losses are
    transformers', against its default (SDPA) attention and its eager one."""
    torch.manual_seed(0)
    ours = ours_class.from_pretrained(minilm_dir).eval()  # a new head, drawn from the seed
    ours.save_pretrained(tmp_path)
    encode = dict(padding=True, truncation=True, max_length=96, return_tensors="pt")
    left = tokenizer(real_sentences[:6], padding_side="left", **encode)
    masked = tokenizer(real_sentences[:6], **encode)
    masked["attention_mask"][::2, 0] = 0  # every other row's [CLS] masked out
    labels = torch.tensor([0, 1, 1, 0, 1, 0])
    if ours_class is BertForMultipleChoice:  # two questions of three choices each
        left, masked = ({name: tensor.view(2, 3, -1) for name, tensor in batch.items()} for batch in (left, masked))
        labels = torch.tensor([2, 0])
    for attn_implementation in ("sdpa", "eager"):
        reference = getattr(transformers, ours_class.__name__).from_pretrained(
            tmp_path, attn_implementation=attn_implementation).eval()
        for batch in (left, masked):
            with torch.inference_mode():
                mine, theirs = ours(**batch, labels=labels), reference(**batch, labels=labels)
            assert (mine.logits - theirs.logits).abs().max() < TOLERANCE, attn_implementation
            assert abs(mine.loss - theirs.loss) < TOLERANCE, attn_implementation


@pytest.mark.parametrize("ours_class", [BertForSequenceClassification, BertForTokenClassification,
                                        BertForQuestionAnswering], ids=lambda cls: cls.__name__)
def test_task_models_take_a_mask_per_query_and_key_as_transformers_does(ours_class, minilm_dir, tokenizer,
                                                                       real_sentences, tmp_path):
    """Logits and losses with a causal mask over a batch of two, against transformers on the same 4-D mask: the
    classifier computes its first token alone, and question answering scores every position (no padding)."""
    torch.manual_seed(0)
    ours = ours_class.from_pretrained(minilm_dir, output_attentions=True)
    ours.save_pretrained(tmp_path)
    reference = TASK_MODELS[ours_class].from_pretrained(tmp_path, output_attentions=True,
                                                        attn_implementation="eager").eval()
    batch = tokenizer(real_sentences[:2], padding=True, return_tensors="pt")
    batch_size, seq = batch["input_ids"].shape
    causal = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch_size, seq, seq)
    labels = {BertForSequenceClassification: {"labels": torch.tensor([0, 1])},
              BertForTokenClassification: {"labels": torch.randint(0, 2, (batch_size, seq))},
              BertForQuestionAnswering: {"start_positions": torch.tensor([3, seq - 1]),
                                         "end_positions": torch.tensor([5, seq - 1])}}[ours_class]
    inputs = {"input_ids": batch["input_ids"], "token_type_ids": batch["token_type_ids"], **labels}
    with torch.inference_mode():
        mine = ours(**inputs, attention_mask=causal)
        theirs = reference(**inputs, attention_mask=mask_forms(causal)["4-D additive"])
        # without the attention weights the classifier's last layer computes its first token alone
        quick = ours(**inputs, attention_mask=causal, output_attentions=False)
    for output in (mine, quick):
        assert abs(output.loss - theirs.loss) < 1e-4
        assert (output.to_tuple()[1] - theirs.to_tuple()[1]).abs().max() < 1e-4  # the first logits
    for a, b in zip(mine.attentions, theirs.attentions):
        assert (a - b).abs().max() < TOLERANCE
        assert a[causal[:, None].expand_as(a).logical_not()].max() == 0  # no weight on a later token


def test_a_mask_per_query_and_key_of_the_wrong_shape_is_named(minilm):
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with pytest.raises(BertforgeError, match=r"a mask per query and key must be \(1, 4, 4\) or \(1, 1 or 12 heads"):
        minilm(ids, torch.ones(1, 4, 5))
    with pytest.raises(BertforgeError, match=r"attention_mask has shape \(1, 3, 4, 4\)"):
        minilm(ids, torch.ones(1, 3, 4, 4, dtype=torch.bool))
    with pytest.raises(BertforgeError, match=r"attention_mask has shape \(2, 4, 4\)"):
        minilm(ids, torch.ones(2, 4, 4))


def test_a_decoders_options_that_ask_nothing_are_taken_as_transformers_takes_them(tiny_config):
    """Code written for any transformers model passes use_cache and a decoder's inputs as None to an encoder."""
    ids = torch.tensor([[2, 5, 7, 3]])
    for model in (BertModel(tiny_config), BertForSequenceClassification(tiny_config), BertForMaskedLM(tiny_config)):
        model.eval()
        plain = model(ids).to_tuple()[0]
        for options in ({"use_cache": False}, {"use_cache": True, "encoder_hidden_states": None,
                                               "encoder_attention_mask": None, "past_key_values": None,
                                               "head_mask": None}):
            torch.testing.assert_close(model(ids, **options).to_tuple()[0], plain)
        with pytest.raises(BertforgeError, match="head_mask: bertforge's BERT is an encoder"):
            model(ids, head_mask=torch.ones(tiny_config.num_hidden_layers, tiny_config.num_attention_heads))
        with pytest.raises(TypeError, match="unexpected keyword argument 'not_an_option'"):
            model(ids, not_an_option=1)


def test_torch_export_reads_the_outputs_as_trees(tiny_config, random_batch):
    """torch.export (what torch.compile and the exporters build on) takes the output dataclasses as it takes
    transformers' ModelOutput: the exported program gives the eager model's outputs."""
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=2, seq_len=7)
    full = torch.ones_like(attention_mask)  # a graph computes every position: compare where eager computes them
    for model in (BertModel(tiny_config), BertForSequenceClassification(tiny_config)):
        model.eval()
        program = torch.export.export(model, (input_ids,), {"attention_mask": full})
        exported, eager = program.module()(input_ids, attention_mask=full), model(input_ids, attention_mask=full)
        assert type(exported) is type(eager)
        torch.testing.assert_close(exported[0], eager[0])


def test_inputs_of_the_wrong_kind_are_named(tiny_config):
    """Lists, numpy arrays, ids that are no integer ids and empty batches get a one-line error, not torch's from
    inside the embedding lookup or the packing."""
    model = BertModel(tiny_config).eval()
    ids = torch.tensor([[2, 5, 7, 3], [2, 8, 3, 0]])
    with pytest.raises(BertforgeError, match=r"^input_ids must be a torch tensor, got a list \(.*return_tensors='pt'"):
        model(ids.tolist())
    with pytest.raises(BertforgeError, match=r"^input_ids must be a torch tensor, got a numpy array"):
        model(ids.numpy())
    with pytest.raises(BertforgeError, match=r"^attention_mask must be a torch tensor, got a numpy array"):
        model(ids, attention_mask=torch.ones_like(ids).numpy())
    for dtype in (torch.float32, torch.int16, torch.uint8, torch.bool):
        with pytest.raises(BertforgeError, match=f"^input_ids must hold integer ids .*, got {dtype}$"):
            model(ids.to(dtype))
        for name in ("token_type_ids", "position_ids"):
            with pytest.raises(BertforgeError, match=f"^{name} must hold integer ids .*, got {dtype}$"):
                model(ids, **{name: torch.zeros_like(ids, dtype=dtype)})
    with pytest.raises(BertforgeError, match=r"^input_ids is empty, shape \(0, 4\)"):
        model(ids[:0])
    with pytest.raises(BertforgeError, match=r"^input_ids is empty, shape \(2, 0\)"):
        model(ids[:, :0])
    with pytest.raises(BertforgeError, match=r"^input_ids is empty, shape \(1, 0, 4\)"):
        BertForMultipleChoice(tiny_config)(ids[None, :0])
    assert model(ids.int()).last_hidden_state.shape == (2, 4, 32)  # int32 ids, which the lookup takes, still work


def test_position_ids_outside_the_table_are_named(tiny_config):
    model = BertModel(tiny_config).eval()
    ids = torch.tensor([[2, 5, 7, 3]])
    with pytest.raises(BertforgeError, match="^position id 64 is outside the model's max_position_embeddings of 64"):
        model(ids, position_ids=torch.tensor([[0, 1, 2, 64]]))
    with pytest.raises(BertforgeError, match="^position id -1 is outside the model's max_position_embeddings"):
        model(ids, position_ids=torch.tensor([[-1, 0, 1, 2]]))
    model(ids, position_ids=torch.tensor([[60, 61, 62, 63]]))  # the last positions are the table's


def test_a_layer_hook_reads_and_patches_as_transformers_does_through_the_batch_layout(minilm_dir, batch):
    """Hooks inside the encoder see packed tokens: code written for transformers' (batch, seq, hidden) would patch
    the wrong numbers silently, so the model warns, once, naming the README's recipe. The recipe (unpack, edit,
    pack back) zeroes token 1 of every text in layer 2's output and gives transformers' patched outputs."""
    ours = BertModel.from_pretrained(minilm_dir).eval()
    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()

    def patch_ours(module, inputs, output):
        layout = inputs[1]
        hidden = layout.unpack(output[0]).clone()
        hidden[:, 1] = 0
        return (layout.pack(hidden), *output[1:])

    def patch_theirs(module, inputs, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[:, 1] = 0
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handles = [ours.encoder.layers[2].register_forward_hook(patch_ours),
               theirs.encoder.layer[2].register_forward_hook(patch_theirs)]
    try:
        with torch.inference_mode():
            with pytest.warns(UserWarning, match=r"a forward hook on encoder.layers.2 sees the encoder's real tokens "
                                                 r"packed"):
                patched = ours(**batch).last_hidden_state
            expected = theirs(**batch).last_hidden_state
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # once per model
                ours(**batch)
    finally:
        for handle in handles:
            handle.remove()
    real = batch["attention_mask"].bool()
    assert real.sum() < real.numel()  # a padded batch: packing moves the tokens
    torch.testing.assert_close(patched[real], expected[real], atol=1e-4, rtol=0)
    with torch.inference_mode():
        assert (patched[real] - ours(**batch).last_hidden_state[real]).abs().max() > 0.1  # the patch changed it


def test_a_hook_on_an_inner_module_unpacks_with_the_encoders_layout(minilm_dir, batch):
    """A hook on a layer's query projection gets packed (tokens, hidden) alone: the encoder's running layout
    unpacks it into transformers' (batch, seq, hidden) queries."""
    ours = BertModel.from_pretrained(minilm_dir).eval()
    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()
    seen = {}
    handles = [ours.encoder.layers[3].attention.query.register_forward_hook(
                   lambda module, inputs, output: seen.__setitem__("ours", ours.encoder.layout.unpack(output))),
               theirs.encoder.layer[3].attention.self.query.register_forward_hook(
                   lambda module, inputs, output: seen.__setitem__("theirs", output))]
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the warning says what this test does
            ours(**batch), theirs(**batch)
    finally:
        for handle in handles:
            handle.remove()
    real = batch["attention_mask"].bool()
    assert seen["ours"].shape == seen["theirs"].shape and ours.encoder.layout is None  # only while it runs
    torch.testing.assert_close(seen["ours"][real], seen["theirs"][real], atol=1e-4, rtol=0)


def test_hooks_that_know_the_layout_raise_no_warning(minilm_dir, tokenizer, batch):
    """bertforge's own forward hooks (the attention viewer's, quantize's layer sensitivity, distillation's hidden
    states) read packed tokens on purpose; pre-hooks (pruning's) don't read the tokens at all."""
    from bertforge.compress.distill import LayerOutputs
    from bertforge.compress.sensitivity import recording_outputs
    from bertforge.inference.attention_view import compute_attention

    model = BertModel.from_pretrained(minilm_dir).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compute_attention(model, tokenizer, "The cat sat on the mat.")
        with torch.inference_mode(), recording_outputs(list(model.encoder.layers)) as outputs:
            model(**batch)
        assert all(len(recorded) == 1 for recorded in outputs.values())
        with torch.inference_mode(), LayerOutputs(model).recording() as hidden:
            model(**batch)
        assert len(hidden) == len(model.encoder.layers)
        torch.nn.utils.prune.l1_unstructured(model.encoder.layers[0].attention.query, "weight", amount=0.1)
        with torch.inference_mode():
            model(**batch)


def test_a_raw_state_dict_goes_to_transformers_through_the_key_map(minilm_dir, batch):
    """transformers -> bertforge loads strictly by its own names; back, key_map.to_hf names each tensor."""
    from bertforge.checkpoint.key_map import to_hf

    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()
    ours = BertModel(BertConfig.from_pretrained(minilm_dir)).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    fresh = transformers.BertModel(theirs.config).eval()
    fresh.load_state_dict({to_hf(name): tensor for name, tensor in ours.state_dict().items()}, strict=True)
    with torch.inference_mode():
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(fresh(**batch).last_hidden_state[real], ours(**batch).last_hidden_state[real],
                                   atol=TOLERANCE, rtol=0)
