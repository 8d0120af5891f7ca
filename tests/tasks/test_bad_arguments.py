"""The Python API of fine-tuning (fit, FinetuneConfig, FinetunedModel) with bad arguments: a one-line error that
names the problem, before any work, where a deep traceback, a wrong setting blamed or a silent default was."""

import pytest

from bertforge import BertModel, ConfigError, FinetuneConfig, FinetunedModel, InputError, fit
from bertforge.errors import BertforgeError
from bertforge.tasks.finetune import staging_dir

TRAIN = {"sentence": ["a fine film", "a dull film", "warm and witty", "an utter mess"] * 3,
         "label": ["pos", "neg", "pos", "neg"] * 3}


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory):
    return fit(TRAIN, output=tmp_path_factory.mktemp("fit") / "model", model=str(tiny_model_dir), max_steps=2,
               max_length=16, progress=False)


@pytest.mark.parametrize("call, message", [
    # An unknown task, not the settings it lacks (the error once named max_length, which nobody gave).
    (lambda: FinetuneConfig.from_dict({"task": "bogus", "max_length": 64}), "unknown task 'bogus'"),
    (lambda: FinetuneConfig(training=5), "FinetuneConfig: training: expected an object, got an integer (5)"),
    (lambda: FinetuneConfig(text_column=5), "FinetuneConfig: text_column: expected a string"),
    (lambda: FinetuneConfig(random_init="yes"), "random_init: expected true or false"),
    (lambda: FinetuneConfig(settings={"max_length": 2}), "max_length=2 leaves no room for text"),
    (lambda: FinetunedModel.load(None), "a model is a directory, a cached model's name or 'default', got None"),
    (lambda: BertModel.from_pretrained(5), "got 5"),
])
def test_settings_of_the_wrong_kind_are_refused_as_they_are_made(call, message):
    with pytest.raises(BertforgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_fit_refuses_before_training(tiny_model_dir, tmp_path):
    output = tmp_path / "model"
    with pytest.raises(ConfigError, match="unknown task 'bogus'"):
        fit(TRAIN, output=output, task="bogus")
    with pytest.raises(ConfigError, match=r"seeds must be a list of integer seeds, e\.g\. \[1, 2, 3\], got 5"):
        fit(TRAIN, TRAIN, output=output, seeds=5, model=str(tiny_model_dir))
    # The tiny model has 64 positions: refused before a step (it failed mid-run, asking to truncate).
    with pytest.raises(ConfigError, match=r"max_length 65 is more than the model's max_position_embeddings \(64\)"):
        fit(TRAIN, output=output, model=str(tiny_model_dir), max_length=65, progress=False)
    assert not output.exists() and not staging_dir(output).exists()


@pytest.mark.parametrize("examples, message", [
    ("A gripping film.", "'A gripping film.' is no file: texts go in a list"),
    (None, "expected texts (a list), a data file or a table, got None"),
    (b"a film", "got b'a film'"),
    (["a film", None], "item 1: expected a text or a (text, text_pair) tuple, got None"),
    ([5], "item 0: expected a text or a (text, text_pair) tuple, got 5"),
    ([("a", "b", "c")], "item 0: expected a text or a (text, text_pair) tuple"),
])
def test_predict_and_evaluate_name_what_is_wrong_with_their_examples(model, examples, message):
    for call in (model.predict, model.evaluate):
        with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call(examples)


def test_predict_options_are_checked_not_read_as_not_given(model):
    with pytest.raises(InputError, match="batch_size must be a positive whole number, got 0"):
        model.predict(["a film"], batch_size=0)
    with pytest.raises(ConfigError, match="max_length must be at least 1, got 0"):  # was: the trained max_length
        model.predict(["a film"], max_length=0)
    with pytest.raises(ConfigError, match=r"max_length=2 leaves no room for text between \[CLS\] and \[SEP\]"):
        model.predict(["a film"], max_length=2)
    assert [answer["label"] for answer in model.predict(["a film", ("a film", None)], max_length=3)] == \
        [answer["label"] for answer in model.predict(["a film"] * 2, max_length=3)]
    # Rows as dicts, a pandas column and a generator are read as they were.
    rows = [{"sentence": text, "label": label} for text, label in zip(TRAIN["sentence"], TRAIN["label"])]
    assert model.evaluate(rows) == model.evaluate(TRAIN)
    pandas = pytest.importorskip("pandas")
    texts = TRAIN["sentence"][:3]
    assert model.predict(pandas.Series(texts, index=[9, 4, 1])) == model.predict(text for text in texts) == \
        model.predict(texts)
    with pytest.raises(ConfigError, match="directory is an empty path"):
        model.save("")
