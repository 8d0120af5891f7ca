"""bertforge as a user installs it: the wheel holds what the package reads at run time, and a type checker reads
bertforge's annotations (py.typed), as it does those of transformers, tokenizers and sentence-transformers."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TYPED_USER = '''
from typing_extensions import assert_type

import torch

from bertforge import (BertConfig, BertForSequenceClassification, BertForTokenClassification, BertModel,
                       BertTokenizer, Explanation, SentenceEncoder, explain)
from bertforge.inference.attention_view import AttentionPage, head_view, model_view
from bertforge.tokenizer.encoding import BatchEncoding

tokenizer = BertTokenizer.from_pretrained("default")
assert_type(tokenizer, BertTokenizer)
assert_type(tokenizer(["A sentence."], return_tensors="pt"), BatchEncoding)
model = BertModel.from_pretrained("default")
assert_type(model, BertModel)
assert_type(BertForSequenceClassification.from_pretrained("default", num_labels=2), BertForSequenceClassification)
assert_type(BertForTokenClassification.from_pretrained("default", num_labels=9), BertForTokenClassification)
assert_type(BertConfig.from_pretrained("default"), BertConfig)
assert_type(SentenceEncoder.from_pretrained("default"), SentenceEncoder)
assert_type(explain(model, tokenizer, "A sentence."), Explanation)
attentions = [torch.rand(1, 2, 4, 4)]
assert_type(model_view(attentions, ["a", "b", "c", "d"], html_action="return"), AttentionPage)
assert_type(head_view(attentions, ["a", "b", "c", "d"], html_action="return").data, str)
assert_type(head_view(attentions, ["a", "b", "c", "d"]), AttentionPage | None)
'''


def test_a_type_checker_reads_bertforges_annotations(tmp_path):
    """Without py.typed, mypy refused the import ('module is installed, but missing library stubs or py.typed
    marker') and typed users' code saw Any; loaders typed as the class they are called on, and the attention pages
    html_action="return" gives typed as pages, not as optional."""
    (tmp_path / "typed_user.py").write_text(TYPED_USER, encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "mypy", "--python-executable", sys.executable, "--cache-dir",
                             str(tmp_path / "cache"), "--no-error-summary", "typed_user.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_the_wheel_holds_what_the_package_reads(tmp_path):
    """The attention viewer's page and py.typed are package data, in the wheel beside the modules."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True, timeout=600,
                   capture_output=True)
    [wheel] = (tmp_path / "dist").glob("bertforge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"bertforge/py.typed", "bertforge/inference/attention_view.html", "bertforge_command.py",
            "bertforge/cli/main.py"} <= names
    assert not any(name.startswith("tests/") for name in names)
