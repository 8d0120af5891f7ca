"""Shared fixtures: tiny configs for mechanics, the real MiniLM checkpoint for numerics, real data slices."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import resource
import shutil
import tempfile
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from bertforge import BertConfig
from bertforge.checkpoint import default_model_dir

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO.parent / "shared" / "data"


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers on a 2-core machine: one intra-op thread each, not two that fight over both cores.
        torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def temporary_folders_under_basetemp(tmp_path_factory):
    """Temporary folders the code makes for itself (fit() without an output, a child process's) go under pytest's
    base folder, removed with it, rather than into /tmp run after run until the disk is full."""
    folder = tmp_path_factory.mktemp("tempfile")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield


@pytest.fixture(scope="session", autouse=True)
def no_server_settings_from_the_environment():
    """`bertforge serve` reads text-embeddings-inference's variables (API_KEY, PORT, POOLING, ...) and its own: a
    machine that sets one for something else would change the servers the tests start (an API_KEY: every request
    401). The tests that read them set them themselves."""
    from bertforge.cli.serve import DTYPE_VARIABLE, TEI_API_KEY_VARIABLE, TEI_VARIABLES
    from bertforge.inference.serve.settings import API_KEY_VARIABLE

    with pytest.MonkeyPatch.context() as patch:
        for variable in (*TEI_VARIABLES, TEI_API_KEY_VARIABLE, DTYPE_VARIABLE, API_KEY_VARIABLE):
            patch.delenv(variable, raising=False)
        yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for tiny models: on a shared 2-core machine spinning OpenMP threads make tiny steps 10x
    slower, and each torchrun process gets one thread (the same kernels, so the same rounding)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def inaugural_slice(data_dir, tmp_path_factory):
    """inaugural_slice(lines) -> a text file of the first `lines` lines of pretrain_en's inaugural addresses:
    a real corpus, small enough to prepare in a second."""
    def write(lines: int) -> Path:
        path = tmp_path_factory.mktemp("inaugural") / "slice.txt"
        text = (data_dir / "pretrain_en" / "inaugural.txt").read_text(encoding="utf-8").splitlines()[:lines]
        path.write_text("\n".join(text) + "\n", encoding="utf-8")
        return path
    return write


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        # A checkout without the data skips what needs it; CI must not go green without those tests.
        if os.environ.get("CI") == "true":
            pytest.fail(f"real datasets not found at {DATA_DIR} (CI=true: the tests that need them must run)")
        pytest.skip(f"real datasets not found at {DATA_DIR}")
    return DATA_DIR


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return default_model_dir()


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from bertforge import BertModel
    return BertModel.from_pretrained(minilm_dir)


@pytest.fixture(scope="session")
def hf_minilm(minilm_dir):
    transformers = pytest.importorskip("transformers")
    # eager attention: the reference's SDPA path does not return attention weights
    return transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def seeded_classifier(minilm_dir):
    """seeded_classifier(folder, id2label, seed) -> folder: MiniLM's real encoder with a classifier head drawn from
    `seed`, wide enough that pair scores differ clearly, saved as a user has a cross-encoder."""
    from bertforge import BertForSequenceClassification, BertTokenizer

    def make(folder: Path, id2label: dict[int, str], seed: int) -> Path:
        model = BertForSequenceClassification.from_pretrained(minilm_dir, id2label=id2label)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            model.classifier.weight.copy_(torch.randn(model.classifier.weight.shape, generator=generator))
            model.classifier.bias.copy_(torch.randn(len(id2label), generator=generator))
        model.save_pretrained(folder)
        BertTokenizer.from_pretrained(minilm_dir).save_pretrained(folder)
        return folder
    return make


@pytest.fixture(scope="session")
def tokenizer(minilm_dir):
    from bertforge import BertTokenizer
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="session")
def save_tiny_encoder(tokenizer):
    """save_tiny_encoder(folder) -> folder: a tiny BERT encoder (seeded, so always the same weights) with MiniLM's
    tokenizer, the checkpoint the command line's mechanics tests train and read."""
    from bertforge import BertModel

    def save(folder: Path) -> Path:
        torch.manual_seed(0)
        BertModel(BertConfig.tiny(vocab_size=tokenizer.vocab_size, max_position_embeddings=64)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return folder
    return save


@pytest.fixture
def interrupted_checkpoint_removal():
    """A context in which removing a folder named `checkpoint` raises KeyboardInterrupt: a run killed after its
    folder moved into place and before it removed its optimizer state."""
    @contextmanager
    def interrupted():
        removal = shutil.rmtree

        def killed_at_the_checkpoint(path, *args, **kwargs):
            if Path(path).name == "checkpoint":
                raise KeyboardInterrupt
            return removal(path, *args, **kwargs)

        shutil.rmtree = killed_at_the_checkpoint
        try:
            yield
        finally:
            shutil.rmtree = removal
    return interrupted


@pytest.fixture
def tiny_config() -> BertConfig:
    return BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)


@pytest.fixture(scope="session")
def sst2_dev(data_dir) -> list[tuple[str, int]]:
    with open(data_dir / "sst2" / "dev.tsv", encoding="utf-8") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["sentence"], int(row["label"])) for row in rows]


@pytest.fixture(scope="session")
def squad_contexts(data_dir) -> list[str]:
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    return [paragraph["context"] for article in squad["data"] for paragraph in article["paragraphs"]]


@pytest.fixture(scope="session")
def real_sentences(sst2_dev, squad_contexts) -> list[str]:
    """Real text of very different lengths: short reviews and long Wikipedia paragraphs."""
    return [text for text, _ in sst2_dev[:6]] + squad_contexts[:2] + [sst2_dev[100][0][:20]]


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `name`, filled by `build(folder)` once per test run. pytest-xdist's workers share it (the first
    to ask builds it, a second waits for it) where each would otherwise spend a minute training its own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder = root / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def write_sst2_slice(source: Path, path: Path, start: int, stop: int) -> Path:
    with open(source, encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join("\t".join(row) for row in [rows[0], *rows[1 + start:1 + stop]]) + "\n")
    return path


@pytest.fixture(scope="session")
def sst2_files(data_dir, tmp_path_factory) -> dict[str, Path]:
    """teacher: the first 2,000 training sentences; student: the next 64; dev: the first 400 dev sentences;
    dev_200: the first 200 of those (for the checks that evaluate many times: distillation, the gate's mechanics)."""
    slices = {"teacher": ("train", 0, 2000), "student": ("train", 2000, 2064), "dev": ("dev", 0, 400),
              "dev_200": ("dev", 0, 200)}

    def write(folder: Path):
        for name, (source, start, stop) in slices.items():
            write_sst2_slice(data_dir / "sst2" / f"{source}.tsv", folder / f"{name}.tsv", start, stop)
    folder = built_once(tmp_path_factory, "sst2-slices", write)
    return {name: folder / f"{name}.tsv" for name in slices}


@pytest.fixture(scope="session")
def sst2_teacher(sst2_files, tmp_path_factory) -> Path:
    """MiniLM fine-tuned on 2,000 SST-2 sentences for one epoch and scored on the 400 dev ones (0.77): the
    classification task's learning check, the teacher of the distillation tests and the model of the gate tests."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune
    from bertforge.training.trainer import TrainConfig

    def train(folder: Path):
        finetune(FinetuneConfig(train=str(sst2_files["teacher"]), dev=str(sst2_files["dev"]),
                                output=str(folder / "model"),
                                training=TrainConfig(epochs=1, lr=1e-4, warmup_ratio=0.1, progress=False, seed=0)))
    return built_once(tmp_path_factory, "sst2-teacher", train) / "model"


@pytest.fixture
def file_size_limit():
    """`with file_size_limit(n):` makes every write past n bytes of a file fail as on a full disk (EFBIG, "File too
    large": Python ignores SIGXFSZ, so the write raises), for the block only."""
    @contextmanager
    def limit(size: int):
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    return limit


def make_random_batch(config: BertConfig, batch_size: int = 3, seq_len: int = 11, seed: int = 0):
    """Random ids with a right-padded attention mask of different lengths per row."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, config.vocab_size, (batch_size, seq_len), generator=generator)
    lengths = torch.linspace(seq_len, max(2, seq_len // 3), batch_size).long()
    attention_mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    token_type_ids = (torch.arange(seq_len)[None, :] >= lengths[:, None] // 2).long() * attention_mask
    return input_ids * attention_mask, attention_mask, token_type_ids


@pytest.fixture
def random_batch():
    return make_random_batch


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium (selenium) for testing the offline HTML pages; skipped where it is not installed."""
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip("needs Debian's chromium and chromium-driver: apt-get install -y chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium: pip install selenium")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def run_cli(capsys):
    """run_cli(*argv) -> (exit code, stdout, stderr) of `bertforge *argv`, through the entry point itself (argparse's
    usage errors, which exit, give their code too)."""
    from bertforge.cli.main import main

    def run(*argv):
        try:
            code = main([str(arg) for arg in argv])
        except SystemExit as stop:
            code = stop.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run


@pytest.fixture
def run_command(capsys):
    """run_command(module, *argv) -> (exit code, stdout) of one CLI module's `run`, which raises its errors
    (where the entry point would print them)."""
    def run(module, *argv):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        code = module.run(parser.parse_args([str(arg) for arg in argv]))
        return code, capsys.readouterr().out
    return run


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A random encoder of tiny_config's sizes with MiniLM's real vocabulary, saved as a checkpoint directory:
    fast, and real files for the commands that load one."""
    from bertforge import BertModel

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny")
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
              ).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def write_reviews():
    """A function writing (text, label) reviews as a review,sentiment CSV training file and a dev file (CSV or
    JSONL) in `folder`: the data of the fine-tuning command tests."""
    def write(folder: Path, train: list[tuple[str, str]], dev: list[tuple[str, str]], dev_format: str = "csv"):
        def csv_text(reviews):
            return "review,sentiment\n" + "".join(f'"{text}",{label}\n' for text, label in reviews)

        train_path, dev_path = folder / "train.csv", folder / f"dev.{dev_format}"
        train_path.write_text(csv_text(train))
        dev_path.write_text(csv_text(dev) if dev_format == "csv" else "".join(
            json.dumps({"review": text, "sentiment": label}) + "\n" for text, label in dev))
        return train_path, dev_path
    return write


@pytest.fixture(scope="session")
def within():
    """within(count, n, p, what): asserts count ~ Binomial(n, p), |count - np| below 5 standard deviations."""
    def check(count, n, p, what):
        assert abs(count - n * p) < 5 * math.sqrt(n * p * (1 - p)), f"{what}: {count / n:.4f} vs {p}"
    return check


@pytest.fixture(scope="session")
def recompute() -> str:
    """The training arguments' switch that recomputes activations in the backward pass: transformers 5 renamed
    gradient_checkpointing (kept as an alias to be removed in v6) activation_checkpointing."""
    transformers = pytest.importorskip("transformers")
    names = {field.name for field in dataclasses.fields(transformers.TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


@pytest.fixture(scope="session")
def inaugural_corpus(inaugural_slice, tmp_path_factory, minilm_dir):
    """inaugural_corpus(lines) -> a folder whose data/ holds inaugural_slice(lines) prepared for pre-training
    with MiniLM's tokenizer."""
    from bertforge import BertTokenizer
    from bertforge.pretraining import prepare_corpus

    def prepare(lines: int) -> Path:
        folder = tmp_path_factory.mktemp("corpus")
        prepare_corpus([inaugural_slice(lines)], BertTokenizer.from_pretrained(minilm_dir), folder / "data",
                       progress=False)
        return folder
    return prepare


README = Path(__file__).resolve().parents[1] / "README.md"


def readme_expected_output(code: str) -> list[str]:
    """The `# ...` comment lines that directly follow a print(...) call (possibly several lines long), at the
    call's own indentation (a print inside an `if` block included)."""
    expected, indent = [], None
    for line in code.splitlines():
        stripped = line.lstrip(" ")
        depth = len(line) - len(stripped)
        if stripped.startswith("print("):
            indent = depth
        elif indent is not None and depth == indent and stripped.startswith("# "):
            expected.append(stripped[2:])
        elif indent is not None and depth <= indent:
            indent = None
    return expected


@pytest.fixture
def run_readme_block(tmp_path):
    """run_readme_block(code) runs a README Python block as written (its /tmp/ paths moved into the test's own
    folder), checks that it prints what the README shows under its print calls, and returns its variables."""
    def run(code: str) -> dict:
        code = code.replace("/tmp/", f"{tmp_path}/")
        namespace: dict = {"__name__": "__main__"}  # run as a script is
        printed = io.StringIO()
        with redirect_stdout(printed):
            exec(compile(code, str(README), "exec"), namespace)
        assert printed.getvalue().splitlines() == readme_expected_output(code)
        return namespace
    return run


@pytest.fixture(scope="session")
def tensorboard_scalars():
    """tensorboard_scalars(folder) -> {tag: [(step, value), ...]}: the scalars of the TensorBoard event files in
    `folder` as the dashboard shows them, read by tensorboard's own reader (every value kept, the steps a resumed
    run purged hidden)."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    def read(folder: Path) -> dict[str, list[tuple[int, float]]]:
        accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
        return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
                for tag in accumulator.Tags()["scalars"]}
    return read


@pytest.fixture(scope="session")
def logged_scalars():
    """logged_scalars(records) -> {tag: [(step, value), ...]}: the numbers of a run's JSON-lines log records as a
    transformers Trainer's TensorBoard callback names them (train/loss, train/learning_rate, eval/accuracy), at
    the float32 precision of TensorBoard's scalars. An evaluation's epoch is no curve of its own."""
    def scalars(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
        tags: dict[str, list[tuple[int, float]]] = {}
        for record in records:
            for name, value in record.items():
                if name in ("event", "step") or (record["event"] == "eval" and name == "epoch"):
                    continue
                tag = f"{record['event']}/{'learning_rate' if name == 'lr' else name}"
                tags.setdefault(tag, []).append((record["step"], torch.tensor(value, dtype=torch.float32).item()))
        return tags
    return scalars
