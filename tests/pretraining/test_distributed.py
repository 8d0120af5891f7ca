"""Multi-process pre-training under torchrun (2 CPU processes, gloo): the same losses, weights and held-out
evaluation as one process doing the same arithmetic; a killed run resumes exactly; the torchrun environment is
read and checked."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from bertforge import BertModel, BertTokenizer, fast_cpu
from bertforge.checkpoint.train_state import TRAIN_STATE_FILE
from bertforge.errors import ConfigError
from bertforge.pretraining import run
from bertforge.pretraining.collate import PretrainingCollator, batches
from bertforge.pretraining.corpus import CorpusReader
from bertforge.pretraining.evaluation import evaluate_mlm
from bertforge.pretraining.heads import BertForPreTraining
from bertforge.pretraining.instances import InstanceStream
from bertforge.pretraining.masking import Masker
from bertforge.pretraining.objectives import get_objective
from bertforge.pretraining.run import PretrainConfig, pretrain
from bertforge.runtime import seed_everything
from bertforge.training.distributed import ProcessInfo, rank_seed, read_environment, select_device
from bertforge.training.optim import build_optimizer, warmup_schedule

WORLD_SIZE, BATCH_SIZE, ACCUMULATION, STEPS, SEQ_LEN, LR, HOLDOUT = 2, 4, 2, 4, 32, 1e-3, 0.1
# A narrow model (with BERT's dropout) keeps each process's steps to milliseconds.
MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 64}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(inaugural_corpus):
    folder = inaugural_corpus(600)
    (folder / "model.json").write_text(json.dumps(MODEL))
    return folder


def torchrun(corpus, output, *extra, script=None):
    """`pretrain train` in 2 processes on this machine, as a user would start it."""
    target = [str(script)] if script else ["-m", "bertforge"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD_SIZE),
               *target, "pretrain", "train", "--size", str(corpus / "model.json"), "--data", str(corpus / "data"),
               "--output", str(output), "--steps", str(STEPS), "--batch-size", str(BATCH_SIZE),
               "--grad-accum", str(ACCUMULATION), "--max-length", str(SEQ_LEN), "--lr", str(LR), "--warmup-steps", "0",
               "--holdout", str(HOLDOUT), "--log-every", "1", "--save-every", "2", "--no-progress", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def logged(output, event="train"):
    records = [json.loads(line) for line in (output / "log.jsonl").read_text().splitlines()]
    return {record["step"]: record for record in records if record["event"] == event}


@pytest.fixture(scope="module")
def two_processes(corpus, tmp_path_factory):
    output = tmp_path_factory.mktemp("ddp") / "run"
    result = torchrun(corpus, output)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("trained 4 steps") == 1  # rank 0 alone reports
    return output


def one_process_reference(corpus, minilm_dir):
    """The 2-process run's arithmetic done by one process: every optimizer step backpropagates, for each rank's part
    of the corpus and each of its micro-batches, loss / (micro-batches x ranks), the mean that DDP's gradient
    averaging and the accumulation make. Each rank's batches, masks and dropout come from that rank's own stream,
    collator seed and torch generator, switched in before its micro-batch. Returns the model and the mean loss of
    each step's 2 x 2 micro-batches."""
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    objective = get_objective("mlm+nsp")
    seed_everything(0)
    model = objective.build_model(run.model_config(str(corpus / "model.json"), tokenizer, SEQ_LEN))
    fast_cpu.accelerate(model)  # the run's own dropout masks: it trains with the CPU fast paths
    dropout_states = [torch.get_rng_state(), torch.manual_seed(rank_seed(0, 1)).get_state()]
    optimizer = build_optimizer(model, LR, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6)
    scheduler = warmup_schedule(optimizer, 0, STEPS)
    masker = Masker(tokenizer.vocab)
    parts = []
    for rank in range(WORLD_SIZE):
        reader = CorpusReader(corpus / "data", split="train", holdout=HOLDOUT, rank=rank, world_size=WORLD_SIZE)
        collator = PretrainingCollator(masker, tokenizer.vocab.pad_token_id, seed=rank_seed(0, rank))
        parts.append(batches(InstanceStream(reader, SEQ_LEN, "next_sentence", seed=0), collator, BATCH_SIZE))
    model.train()
    losses = []
    for _ in range(STEPS):
        step_losses = []
        for _ in range(ACCUMULATION):
            for rank, part in enumerate(parts):
                torch.set_rng_state(dropout_states[rank])
                loss = objective.loss(model, next(part)).loss
                dropout_states[rank] = torch.get_rng_state()
                (loss / (ACCUMULATION * WORLD_SIZE)).backward()
                step_losses.append(loss.item())
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(sum(step_losses) / len(step_losses))
    return model, losses


def test_two_processes_match_one_process_doing_the_same_arithmetic(two_processes, corpus, minilm_dir):
    """Exact up to float rounding: the single-process reference reads both ranks' parts, so it sees the sequences
    the two processes saw (a plain 1 x batch 8 run can't: each rank's stream is shuffled by its own seed)."""
    reference, losses = one_process_reference(corpus, minilm_dir)
    train = logged(two_processes)
    assert sorted(train) == [1, 2, 3, 4]
    for step, loss in enumerate(losses, 1):
        assert train[step]["loss"] == pytest.approx(loss, rel=1e-6)  # the global batch's mean, not rank 0's
    ours = BertForPreTraining.from_pretrained(two_processes).state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(ours[name], value, atol=1e-6, rtol=1e-5, msg=name)

    # Rank 0 scores the whole held-out split alone: the numbers one process gets from the same weights.
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    expected = evaluate_mlm(reference, CorpusReader(corpus / "data", split="eval", holdout=HOLDOUT),
                            Masker(tokenizer.vocab), tokenizer.vocab.pad_token_id, BATCH_SIZE, SEQ_LEN, max_batches=20)
    evaluation = logged(two_processes, "eval")[STEPS]
    assert evaluation["masked_tokens"] == expected["masked_tokens"]
    assert evaluation["loss"] == pytest.approx(expected["loss"], rel=1e-6)


def test_checkpoint_holds_every_rank_and_a_killed_run_resumes_exactly(two_processes, corpus, tmp_path):
    state = torch.load(two_processes / "checkpoint" / TRAIN_STATE_FILE, weights_only=True)
    ranks = state["data"]["ranks"]
    assert [part["stream"]["settings"]["rank"] for part in ranks] == [0, 1]
    assert not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])  # each rank's own dropout

    # Both processes die during step 3, after the checkpoint of step 2, as a killed job would.
    script = tmp_path / "dying.py"
    script.write_text(
        "import dataclasses, sys\n"
        "from bertforge.cli.main import main\n"
        "from bertforge.pretraining import run\n"
        "objective, calls = run.get_objective('mlm+nsp'), []\n"
        "def dying_loss(model, batch, generator=None):\n"
        "    calls.append(1)\n"
        f"    if len(calls) > 2 * {ACCUMULATION}:\n"
        "        raise KeyboardInterrupt\n"
        "    return objective.loss(model, batch, generator)\n"
        "run.get_objective = lambda name: dataclasses.replace(objective, loss=dying_loss)\n"
        "sys.exit(main(sys.argv[1:]))\n")
    assert torchrun(corpus, tmp_path / "run", script=script).returncode != 0
    assert sorted(logged(tmp_path / "run.incomplete")) == [1, 2]  # the killed run, not yet in place
    result = torchrun(corpus, tmp_path / "run", "--resume")
    assert result.returncode == 0, result.stderr

    expected, got = logged(two_processes), logged(tmp_path / "run")
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6)
    first = BertModel.from_pretrained(two_processes).state_dict()
    second = BertModel.from_pretrained(tmp_path / "run").state_dict()
    for name in first:
        torch.testing.assert_close(second[name], first[name], atol=1e-6, rtol=0)


def test_torchrun_environment_is_read_and_checked():
    assert read_environment({}) == ProcessInfo(rank=0, world_size=1, local_rank=0)
    launch = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    assert read_environment(launch) == ProcessInfo(rank=3, world_size=4, local_rank=1)
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set: start multi-process runs with torchrun"):
        read_environment({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="RANK must be an integer, got 'one'"):
        read_environment({**launch, "RANK": "one"})
    with pytest.raises(ConfigError, match=r"RANK must be in 0\.\.3 \(WORLD_SIZE=4\), got 4"):
        read_environment({**launch, "RANK": "4"})
    assert select_device("cpu", ProcessInfo(1, 2, 1)) == torch.device("cpu")
    assert select_device("cuda", ProcessInfo(3, 4, 1)) == torch.device("cuda", 1)  # this process's own GPU
    assert select_device("cuda", ProcessInfo()) == torch.device("cuda")


def test_ranks_draw_independently_and_rank_zero_keeps_the_seed():
    assert rank_seed(7, 0) == 7  # a single process draws what it always did
    seeds = {rank_seed(seed, rank) for seed in range(3) for rank in range(1, 4)}
    assert len(seeds) == 9 and not seeds & {0, 1, 2}


def test_a_multi_process_config_outside_torchrun_is_a_one_line_error(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    config = PretrainConfig(data=str(tmp_path), output=str(tmp_path / "out"), rank=1, world_size=2)
    with pytest.raises(ConfigError, match="rank 1 of 2, but this process was started as rank 0 of 1"):
        pretrain(config)
    with pytest.raises(ConfigError, match="rank must be in 0..1"):
        PretrainConfig(data="d", output="o", rank=2, world_size=2)
