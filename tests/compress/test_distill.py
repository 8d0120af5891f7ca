"""Distillation: the student is made of the teacher's layers, its losses are what the papers define (checked against
hand-computed values), and the dev-set gate refuses a student that loses more than allowed.

Not here: a distilled student beating its control (the same layers trained on the true labels alone), because it
does not, reliably. In small SST-2 runs (200-400 sentences, teachers fine-tuned on 600-6,000) it won twice by
0.5-1.5 points and lost twice by 0.5-1.25; on all of SST-2 the control was 0.46 points ahead, on CoNLL-2003 the
distilled student 0.26 ahead (bench/README.md). A test asserting either would assert noise."""

import pytest
import torch

from bertforge import BertForSequenceClassification, BertForTokenClassification
from bertforge.cli.main import main
from bertforge.compress.distill import DistillationLoss, DistillConfig, student_from_teacher, teacher_layers
from bertforge.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_teacher_layers_are_every_kth_ending_with_the_last():
    assert teacher_layers(6, 3) == [1, 3, 5]
    assert teacher_layers(12, 4) == [2, 5, 8, 11]
    assert teacher_layers(6, 6) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ConfigError, match="not smaller"):
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


def test_unknown_soft_weight_is_a_config_error():
    with pytest.raises(ConfigError, match="soft_weight"):
        DistillConfig(soft_weight=1.5)


def test_the_library_call_takes_the_teachers_task_and_settings(data_dir, tmp_path):
    """distill(FinetuneConfig(train=..., model=teacher)) without a task: the teacher's (here ner) and its run's
    settings, not the config's default classification ones."""
    from bertforge.compress.distill import distill
    from bertforge.tasks.finetune import FinetuneConfig, FinetunedModel, finetune
    from bertforge.training.trainer import TrainConfig

    lines = (data_dir / "conll2003" / "eng.train").read_text(encoding="utf-8").split("\n\n")[1:21]
    train = tmp_path / "train.conll"
    train.write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    steps = TrainConfig(max_steps=2, progress=False)
    finetune(FinetuneConfig(train=str(train), output=str(tmp_path / "teacher"), task="ner", training=steps))
    result = distill(FinetuneConfig(train=str(train), output=str(tmp_path / "student"), model=str(tmp_path / "teacher"),
                                    training=steps), DistillConfig(student_layers=2))
    assert result.written
    student = FinetunedModel.load(tmp_path / "student")
    assert student.task.name == "ner" and student.model.config.num_hidden_layers == 2
