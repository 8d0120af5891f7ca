"""Distillation: the student is made of the teacher's layers, its losses are what the papers define (checked against
hand-computed values), it learns from its teacher what a small slice of true labels cannot teach its control, and
the dev-set gate refuses a student that loses more than allowed."""

import json

import pytest
import torch

from bertforge import BertForSequenceClassification, BertForTokenClassification
from bertforge.cli.main import main
from bertforge.compress.distill import DistillationLoss, DistillConfig, student_from_teacher, teacher_layers
from bertforge.compress.gate import COMPRESSION_FILE
from bertforge.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_teacher_layers_are_every_kth_ending_with_the_last():
    assert teacher_layers(6, 3) == [1, 3, 5]
    assert teacher_layers(12, 4) == [2, 5, 8, 11]
    assert teacher_layers(6, 6) == [0, 1, 2, 3, 4, 5]
    assert teacher_layers(6, 5) == [0, 1, 2, 3, 5]  # as the README says: layers 1-4 and 6
    with pytest.raises(ConfigError, match="has more than its teacher"):
        teacher_layers(6, 7)


def test_student_copies_the_chosen_layers_embeddings_and_head(tiny_config):
    config = tiny_config.__class__(**{**tiny_config.__dict__, "num_hidden_layers": 4})
    teacher = BertForSequenceClassification(config).eval()
    student = student_from_teacher(teacher, 2)
    assert student.config.num_hidden_layers == 2
    chosen = [teacher.bert.encoder.layers[i] for i in (1, 3)]
    for student_layer, teacher_layer in zip(student.bert.encoder.layers, chosen):
        assert torch.equal(student_layer.feed_forward.up.weight, teacher_layer.feed_forward.up.weight)
    assert torch.equal(student.classifier.weight, teacher.classifier.weight)
    assert torch.equal(student.bert.embeddings.tokens.weight, teacher.bert.embeddings.tokens.weight)


def test_soft_label_loss_is_hintons(tiny_config):
    teacher = BertForSequenceClassification(tiny_config).eval()
    student = student_from_teacher(teacher, 1)
    loss = DistillationLoss(teacher, student, DistillConfig(1, temperature=3.0, soft_weight=0.7))
    logits, teacher_logits = torch.tensor([[1.0, -1.0]]), torch.tensor([[0.5, 2.0]])
    p = (teacher_logits / 3).softmax(-1)
    expected = (p * (p.log() - (logits / 3).log_softmax(-1))).sum() * 9  # KL(teacher || student) x T²
    assert torch.allclose(loss.soft_loss(logits, teacher_logits, torch.tensor([0])), expected)
    # regression: the teacher's score is the target; per token: only the scored positions count
    assert torch.allclose(loss.soft_loss(torch.tensor([[2.0]]), torch.tensor([[0.5]]), None), torch.tensor(2.25))
    per_token = loss.soft_loss(torch.tensor([[[1.0, -1.0], [9.0, 9.0]]]), torch.tensor([[[0.5, 2.0], [0.0, 0.0]]]),
                               torch.tensor([[1, -100]]))
    assert torch.allclose(per_token, expected)


def test_multi_label_soft_loss_is_each_labels_two_way_kl(tiny_config):
    config = tiny_config.__class__(**{**tiny_config.__dict__, "problem_type": "multi_label_classification",
                                      "id2label": {0: "a", 1: "b", 2: "c"}})
    teacher = BertForSequenceClassification(config).eval()
    loss = DistillationLoss(teacher, student_from_teacher(teacher, 1), DistillConfig(1, temperature=2.0))
    logits, teacher_logits = torch.tensor([[1.0, -1.0, 0.0]]), torch.tensor([[0.5, 2.0, -3.0]])
    p, q = torch.sigmoid(teacher_logits / 2), torch.sigmoid(logits / 2)
    expected = (p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()).mean() * 4  # mean KL per label x T²
    assert torch.allclose(loss.soft_loss(logits, teacher_logits, None), expected)
    assert loss.soft_loss(teacher_logits, teacher_logits, None).abs() < 1e-6


def test_hidden_state_loss_is_zero_for_a_student_equal_to_its_teacher(tiny_config):
    teacher = BertForTokenClassification(tiny_config).eval()
    student = student_from_teacher(teacher, tiny_config.num_hidden_layers).eval()
    loss = DistillationLoss(teacher, student, DistillConfig(tiny_config.num_hidden_layers, soft_weight=1.0,
                                                            hidden_weight=1.0))
    batch = {"input_ids": torch.tensor([[2, 5, 7, 3], [2, 9, 3, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
             "labels": torch.tensor([[1, 0, 1, -100]] * 2)}
    assert loss(student, batch).item() == pytest.approx(0.0, abs=1e-6)
    student.bert.encoder.layers[0].output_norm.bias.data += 1.0  # every hidden state moves by ~1
    assert loss(student, batch).item() > 0.5


def test_distill_refuses_a_student_that_drops_too_much(sst2_teacher, sst2_files, tmp_path, capsys):
    # One layer trained for a few steps loses far more than a hundredth of a point against six.
    assert main(["distill", "--teacher", str(sst2_teacher), "--train", str(sst2_files["student"]),
                 "--dev", str(sst2_files["dev"]), "--output", str(tmp_path / "one"), "--student-layers", "1",
                 "--max-steps", "2", "--max-drop", "0.01", "--no-progress"]) == 1
    assert "nothing written" in capsys.readouterr().out
    assert not (tmp_path / "one").exists() and not list(tmp_path.iterdir())


def test_a_student_learns_from_its_teacher_what_a_slice_of_labels_cannot_teach_its_control(sst2_teacher, sst2_files,
                                                                                            tmp_path):
    """64 labelled sentences, 10 epochs, scored on the first 200 dev sentences (teacher 0.745). Its control, trained
    on the true labels alone, does not reconnect the cut layers (0.635-0.66 over seeds 0, 1, 7 and 42); the
    student, trained on the teacher's soft labels and hidden states, gets back to 0.735-0.745 on each of them.
    On full training sets the two are within noise of each other (bench/README.md)."""
    common = ["distill", "--teacher", str(sst2_teacher), "--train", str(sst2_files["student"]),
              "--dev", str(sst2_files["dev_200"]), "--student-layers", "3", "--epochs", "10", "--max-drop", "100",
              "--no-progress"]
    assert main([*common, "--soft-weight", "0.9", "--hidden-weight", "1.0", "--output", str(tmp_path / "student")]) == 0
    assert main([*common, "--without-teacher", "--output", str(tmp_path / "control")]) == 0
    student, control = (json.loads((tmp_path / name / COMPRESSION_FILE).read_text()) for name in ("student", "control"))
    teacher_accuracy = student["reference"]["metrics"]["accuracy"]
    student_accuracy, control_accuracy = (run["candidate"]["metrics"]["accuracy"] for run in (student, control))
    assert student_accuracy >= control_accuracy + 0.04  # 8 of the 200 sentences; the four seeds gave 15-22
    assert student_accuracy >= teacher_accuracy - 0.05


def test_unknown_soft_weight_is_a_config_error():
    with pytest.raises(ConfigError, match="soft_weight"):
        DistillConfig(soft_weight=1.5)


@pytest.mark.parametrize("temperature", [1e308, 1e-300, 0.0])
def test_a_temperature_outside_the_float_range_is_a_config_error(temperature):
    """T = 1e308 passed as a positive number, then the loss's T^2 overflowed into a traceback."""
    with pytest.raises(ConfigError, match="temperature must be"):
        DistillConfig(temperature=temperature)


def test_the_library_call_takes_the_teachers_task_and_settings(data_dir, tmp_path, capsys):
    """distill(FinetuneConfig(train=..., model=teacher)) without a task: the teacher's (here ner) and its run's
    settings, not the config's default classification ones. A teacher trained with class weights and smoothed
    labels distills through the command too, which takes its run's settings but not that recipe for the true labels'
    loss (the distillation loss replaces it), unless --without-teacher; given with a teacher, they are refused."""
    from bertforge.compress.distill import distill
    from bertforge.tasks.finetune import FinetuneConfig, finetune
    from bertforge.tasks.finetuned_model import FinetunedModel
    from bertforge.training.trainer import TrainConfig

    lines = (data_dir / "conll2003" / "eng.train").read_text(encoding="utf-8").split("\n\n")[1:21]
    train = tmp_path / "train.conll"
    train.write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    steps = TrainConfig(max_steps=2, progress=False)
    finetune(FinetuneConfig(train=str(train), output=str(tmp_path / "teacher"), task="ner", class_weights="balanced",
                            training=TrainConfig(max_steps=2, progress=False, label_smoothing=0.1)))
    result = distill(FinetuneConfig(train=str(train), output=str(tmp_path / "student"), model=str(tmp_path / "teacher"),
                                    training=steps), DistillConfig(student_layers=2))
    assert result.written
    student = FinetunedModel.load(tmp_path / "student")
    assert student.task.name == "ner" and student.model.config.num_hidden_layers == 2
    common = ["distill", "--teacher", str(tmp_path / "teacher"), "--train", str(train), "--student-layers", "2",
              "--max-steps", "1", "--no-progress"]
    assert main([*common, "--output", str(tmp_path / "by-command")]) == 0
    run = json.loads((tmp_path / "by-command" / "finetune_config.json").read_text())
    assert run["class_weights"] is None and run["training"]["label_smoothing"] == 0.0
    assert main([*common, "--output", str(tmp_path / "control"), "--without-teacher"]) == 0
    run = json.loads((tmp_path / "control" / "finetune_config.json").read_text())
    assert run["class_weights"] == "balanced" and run["training"]["label_smoothing"] == 0.1
    assert main([*common, "--output", str(tmp_path / "refused"), "--class-weights", "balanced"]) == 1
    assert capsys.readouterr().err.strip().endswith("--label-smoothing and --class-weights shape the true labels' "
                                                    "loss, which distillation replaces with the teacher's; give them "
                                                    "with --without-teacher")


def test_a_rerankers_soft_loss_is_its_sigmoids_two_way_kl_not_a_regressions_mse(tiny_config):
    config = tiny_config.__class__(**{**tiny_config.__dict__, "problem_type": "multi_label_classification",
                                      "id2label": {0: "LABEL_0"}})
    teacher = BertForSequenceClassification(config).eval()
    loss = DistillationLoss(teacher, student_from_teacher(teacher, 1), DistillConfig(1, temperature=2.0))
    logits, teacher_logits = torch.tensor([[1.0], [-2.0]]), torch.tensor([[3.0], [0.5]])
    p, q = torch.sigmoid(teacher_logits / 2), torch.sigmoid(logits / 2)
    expected = (p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()).mean() * 4
    assert torch.allclose(loss.soft_loss(logits, teacher_logits, None), expected)


def test_a_multi_label_teacher_distills_through_the_command(data_dir, tmp_path, capsys):
    """Multi-label (the entity types each real CoNLL-2003 sentence mentions): the command trains a student and
    gates it by the task's own metric, micro F1; the student stays a multi-label model."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune
    from bertforge.tasks.finetuned_model import FinetunedModel
    from bertforge.training.trainer import TrainConfig

    rows = []
    for block in (data_dir / "conll2003" / "eng.train").read_text(encoding="utf-8").split("\n\n")[1:161]:
        lines = [line.split() for line in block.splitlines() if line.strip()]
        types = sorted({line[-1][2:] for line in lines if line[-1] != "O"})
        rows.append(json.dumps({"text": " ".join(line[0] for line in lines), "types": types}))
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    train.write_text("\n".join(rows[:120]) + "\n")
    dev.write_text("\n".join(rows[120:]) + "\n")
    finetune(FinetuneConfig(task="multi_label", train=str(train), output=str(tmp_path / "teacher"),
                            text_column="text", label_column="types",
                            training=TrainConfig(max_steps=8, lr=2e-4, progress=False, seed=0)))
    assert main(["distill", "--teacher", str(tmp_path / "teacher"), "--train", str(train), "--dev", str(dev),
                 "--output", str(tmp_path / "student"), "--student-layers", "2", "--max-steps", "4",
                 "--max-drop", "100", "--no-progress"]) == 0
    assert "micro_f1" in capsys.readouterr().out
    assert json.loads((tmp_path / "student" / COMPRESSION_FILE).read_text())["metric"] == "micro_f1"
    student = FinetunedModel.load(tmp_path / "student")
    assert student.task.name == "multi_label" and student.model.config.num_hidden_layers == 2


def test_help_says_the_run_settings_default_to_the_teachers(capsys):
    """distill's finetune flags take the teacher's run where not given; its help says so rather than show
    FinetuneConfig's defaults (--lr 5e-05, --dev none), which the student never gets."""
    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    help_text = " ".join(capsys.readouterr().out.split()).split(" options: ", 1)[1]  # past the usage line
    for flag in ("--lr LR", "--dev DEV", "--epochs EPOCHS", "--batch-size BATCH_SIZE", "--max-length MAX_LENGTH",
                 "--train TRAIN", "--config FILE"):
        described = help_text.split(flag, 1)[1].split(" --", 1)[0]
        assert described.endswith("(default: the teacher's run)"), (flag, described)
    assert "5e-05" not in help_text and "the last model is kept" not in help_text
    with pytest.raises(SystemExit):  # the student's folder is named, never the teacher's run's output
        main(["distill", "--teacher", "t", "--train", "x.csv"])
    assert "the following arguments are required: --output" in capsys.readouterr().err
