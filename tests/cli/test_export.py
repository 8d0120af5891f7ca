"""`bertforge export onnx|hf` end to end on small models, and the one-line errors a user can cause."""

import dataclasses

import numpy as np
import pytest
import torch

from bertforge import BertForQuestionAnswering, BertModel, BertTokenizer
from bertforge.cli.main import main


@pytest.fixture
def tiny_dirs(tmp_path, tiny_config, tokenizer):
    """A tiny encoder and a tiny question-answering model, each saved with the real vocabulary."""
    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config, vocab_size=tokenizer.vocab_size, initializer_range=0.5)
    directories = {}
    for name, model in (("encoder", BertModel(config)), ("qa", BertForQuestionAnswering(config))):
        directories[name] = model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(directories[name])
    return directories


def onnx_outputs(path, batch):
    from bertforge.inference.onnx import INPUT_NAMES, onnx_session

    session = onnx_session(path)
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, {name: batch[name].numpy() for name in INPUT_NAMES})))


def test_export_onnx_encoder(capfd, tmp_path, tiny_dirs, tokenizer, real_sentences):
    pytest.importorskip("onnxruntime")
    output = tmp_path / "out" / "encoder.onnx"
    # capfd, not run_cli's capsys: the exporter's native code would write to the file descriptors themselves
    code = main(["export", "onnx", "--model", str(tiny_dirs["encoder"]), "--output", str(output)])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert err == ""  # the exporter traces without a data-dependent question or a failed first attempt to report
    assert "max difference from PyTorch" in out and f"to {output}" in out
    batch = tokenizer(real_sentences, padding=True, truncation=True, max_length=64, return_tensors="pt")
    expected = BertModel.from_pretrained(tiny_dirs["encoder"])(**batch)
    actual = onnx_outputs(output, batch)
    is_real = batch["attention_mask"].bool().numpy()
    assert np.abs(actual["last_hidden_state"] - expected.last_hidden_state.detach().numpy())[is_real].max() <= 1e-4
    assert np.abs(actual["pooler_output"] - expected.pooler_output.detach().numpy()).max() <= 1e-4


def test_export_onnx_question_answering(run_cli, tmp_path, tiny_dirs, tokenizer, real_sentences):
    pytest.importorskip("onnxruntime")
    output = tmp_path / "qa.onnx"
    code, out, err = run_cli("export", "onnx", "-m", str(tiny_dirs["qa"]), "-o", str(output),
                             "--task", "question-answering")
    assert code == 0, err
    assert "outputs start_logits, end_logits" in out
    batch = tokenizer(real_sentences[:3], real_sentences[3:6], padding=True, truncation=True, max_length=64,
                      return_tensors="pt")
    expected = BertForQuestionAnswering.from_pretrained(tiny_dirs["qa"])(**batch)
    actual = onnx_outputs(output, batch)
    is_real = batch["attention_mask"].bool().numpy()
    assert np.abs(actual["start_logits"] - expected.start_logits.detach().numpy())[is_real].max() <= 1e-4


def test_export_hf_loads_in_transformers_and_bertforge(run_cli, tmp_path, minilm, tokenizer, real_sentences):
    transformers = pytest.importorskip("transformers")
    output = tmp_path / "exported"
    code, out, err = run_cli("export", "hf", "--model", "default", "--output", str(output))
    assert code == 0, err
    # The default model's sentence-transformers layout (modules.json, sentence_bert_config.json, its prompts in
    # config_sentence_transformers.json, 1_Pooling/) too.
    assert ("config.json, config_sentence_transformers.json, model.safetensors, modules.json, "
            "sentence_bert_config.json, special_tokens_map.json, tokenizer.json, tokenizer_config.json, "
            "vocab.txt") in out
    assert (output / "1_Pooling" / "config.json").is_file()
    batch = tokenizer(real_sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    is_real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = minilm(**batch)
        reference = transformers.BertModel.from_pretrained(output).eval()(**batch)
        reloaded = BertModel.from_pretrained(output)(**batch)
    assert torch.allclose(reference.last_hidden_state[is_real], expected.last_hidden_state[is_real], atol=1e-5)
    assert torch.allclose(reference.pooler_output, expected.pooler_output, atol=1e-5)
    assert torch.equal(reloaded.last_hidden_state, expected.last_hidden_state)
    hf_tokenizer = transformers.BertTokenizer.from_pretrained(output)
    assert hf_tokenizer(real_sentences[:3])["input_ids"] == tokenizer(real_sentences[:3])["input_ids"]
    assert BertTokenizer.from_pretrained(output)(real_sentences[0]) == tokenizer(real_sentences[0])


def test_export_hf_with_onnx_is_one_folder_for_transformers_and_onnx_runtimes(capfd, tmp_path, real_sentences):
    """--onnx adds onnx/model.onnx, where sentence-transformers' ONNX backend and Transformers.js read it: checked
    here against transformers' model loaded from the same folder, run in ONNX Runtime as those runtimes run it."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    from bertforge import SentenceEncoder

    output = tmp_path / "exported"
    (output / "onnx").mkdir(parents=True)  # a folder of the user's, holding no model: their files there stay
    (output / "onnx" / "model_quantized.onnx").write_bytes(b"the user's own graph")
    (output / "notes.txt").write_text("mine")
    assert main(["export", "hf", "--model", "default", "--output", str(output), "--onnx"]) == 0
    out, err = capfd.readouterr()
    assert "onnx/model.onnx, sentence_bert_config.json" in out and "onnx/model.onnx: max difference" in out, err
    assert "notes.txt" not in out and "model_quantized" not in out  # what the export wrote, not what was there
    assert (output / "onnx" / "model_quantized.onnx").read_bytes() == b"the user's own graph"
    assert (output / "notes.txt").read_text() == "mine"
    fast = transformers.AutoTokenizer.from_pretrained(output)
    batch = fast(real_sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        expected = transformers.BertModel.from_pretrained(output).eval()(**batch).last_hidden_state.numpy()
    actual = onnx_outputs(output / "onnx" / "model.onnx", batch)["last_hidden_state"]
    is_real = batch["attention_mask"].bool().numpy()
    assert np.abs(actual - expected)[is_real].max() <= 1e-4
    # the ONNX backend runs the file the folder holds (it would export one where none is)
    mtime = (output / "onnx" / "model.onnx").stat().st_mtime_ns
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(output), device="cpu").encode(real_sentences)
    np.testing.assert_allclose(SentenceEncoder(output, backend="onnx").encode(real_sentences), reference, atol=1e-5)
    assert (output / "onnx" / "model.onnx").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("class_name", ["BertForMaskedLM", "BertForPreTraining"])
def test_export_hf_keeps_the_pretraining_heads(run_cli, tmp_path, tiny_config, tokenizer, class_name,
                                               real_sentences):
    # A pre-trained model (what `pretrain train` writes) exported for transformers fills masks as it did.
    transformers = pytest.importorskip("transformers")
    from bertforge import pretraining

    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config, vocab_size=tokenizer.vocab_size, initializer_range=0.5)
    model = getattr(pretraining, class_name)(config).eval()
    model.save_pretrained(tmp_path / "pretrained")
    tokenizer.save_pretrained(tmp_path / "pretrained")
    code, _, err = run_cli("export", "hf", "--model", str(tmp_path / "pretrained"), "--output",
                           str(tmp_path / "exported"))
    assert code == 0, err
    batch = tokenizer(real_sentences[:4], padding=True, return_tensors="pt")
    reference = getattr(transformers, class_name).from_pretrained(tmp_path / "exported").eval()
    with torch.no_grad():
        name = "prediction_logits" if class_name == "BertForPreTraining" else "logits"
        expected, exported = getattr(model(**batch), name), getattr(reference(**batch), name)
    is_real = batch["attention_mask"].bool()
    torch.testing.assert_close(exported[is_real], expected[is_real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("format_, output, message", [
    ("onnx", "model.txt", "the output must be a .onnx file"),
    ("onnx", "a_file/model.onnx", "a_file is a file, not a folder"),
    ("hf", "a_file", "exists and is not a folder"),
    ("hf", "a_file/model", "a_file is a file, not a folder"),
])
def test_output_errors_are_one_line(run_cli, tmp_path, tiny_dirs, format_, output, message):
    (tmp_path / "a_file").write_text("not a folder")
    code, out, err = run_cli("export", format_, "-m", str(tiny_dirs["encoder"]),
                             "-o", str(tmp_path / output))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("bertforge: error: ") and message in err


@pytest.mark.parametrize("format_", ["onnx", "hf"])
def test_missing_model_dir_is_one_line(run_cli, tmp_path, format_):
    code, _, err = run_cli("export", format_, "--model", str(tmp_path / "nowhere"),
                           "--output", str(tmp_path / "out.onnx"))
    assert code == 1
    assert err.count("\n") == 1 and "no such model directory" in err


def test_an_opset_onnx_runtime_cannot_run_is_one_line_and_writes_nothing(run_cli, tmp_path, tiny_dirs,
                                                                        monkeypatch):
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    import bertforge.inference.onnx as exporter

    output = tmp_path / "model.onnx"
    output.write_bytes(b"an earlier export")
    newest = onnx.defs.onnx_opset_version()
    code, _, err = run_cli("export", "onnx", "-m", tiny_dirs["encoder"], "-o", output, "--opset", newest + 1)
    assert code == 1 and err.count("\n") == 1 and f"opset {newest + 1} is newer than the installed onnx" in err

    def fails(*args):  # as ONNX Runtime 1.32 fails on the Attention node of opset 23
        raise onnxruntime.capi.onnxruntime_pybind11_state.Fail("[ONNXRuntimeError] : 1 : FAIL : Attention node")
    monkeypatch.setattr(exporter, "compare_with_pytorch", fails)
    code, _, err = run_cli("export", "onnx", "-m", tiny_dirs["encoder"], "-o", output)
    assert code == 1 and err.count("\n") == 1 and "can't run the opset" in err and "Attention node" in err
    assert output.read_bytes() == b"an earlier export"
