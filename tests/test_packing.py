"""Packing a padded batch: length blocks, the round trip to the real tokens and back, which keys attention masks."""

import pytest
import torch

from bertforge.packing import group_by_length, pack_batch


@pytest.mark.parametrize("seed", range(5))
def test_length_groups_cover_every_sequence_once_longest_first(seed):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 300, (int(torch.randint(1, 80, (1,), generator=generator)),), generator=generator)
    lengths = lengths.tolist()
    blocks = group_by_length(lengths)
    members = [i for block in blocks for i in block]
    assert sorted(members) == [i for i, length in enumerate(lengths) if length > 0]  # empty sequences left out
    longest = [max(lengths[i] for i in block) for block in blocks]
    assert longest == sorted(longest, reverse=True)
    for earlier, later in zip(blocks, blocks[1:]):
        assert min(lengths[i] for i in earlier) > max(lengths[i] for i in later)  # equal lengths share a block


def test_very_different_lengths_attend_in_separate_blocks():
    assert len(group_by_length([500, 8, 8, 8])) == 2
    assert len(group_by_length([20, 19, 18, 17])) == 1


def test_attention_blocks_round_trip_and_mask_only_padding():
    lengths = torch.tensor([300, 7, 0, 5, 290, 60, 60])
    mask = (torch.arange(300)[None, :] < lengths[:, None]).long()
    mask[5] = mask[5].flip(0)  # left padding: real tokens need not start a row
    padding = pack_batch(mask, torch.float32)
    # Each token, as the batch holds it, is (its sequence, its order in the sequence).
    positions = torch.stack([torch.arange(7)[:, None].expand(7, 300), mask.cumsum(1) - 1], -1).float()
    tokens = padding.pack(positions)
    assert torch.equal(padding.unpack(tokens)[mask.bool()], positions[mask.bool()])
    assert len(padding.blocks) > 1
    seen, rows = [], []
    for block in padding.blocks:
        rectangle = block.gather(tokens)  # (batch, seq, 2)
        rows.append(rectangle.reshape(-1, 2))
        real_keys = torch.ones(block.batch, block.seq, dtype=torch.bool) if block.bias is None else \
            block.bias[:, 0, 0, :] == 0
        for row, real in zip(rectangle, real_keys):
            sequence = int(row[0, 0])
            assert torch.equal(row[:, 0], torch.full((block.seq,), float(sequence)))  # padding repeats its own
            assert torch.equal(row[real, 1], torch.arange(int(lengths[sequence])).float())  # tokens fill the start
            assert real.sum() == lengths[sequence]
            seen.append(sequence)
        assert real_keys.sum(1).max() == block.seq  # each block is as long as its longest sequence
    assert sorted(seen) == [0, 1, 3, 4, 5, 6]  # the empty sequence attends nowhere
    assert torch.equal(padding.from_blocks(rows), tokens)
    equal_lengths = next(block for block in padding.blocks if block.seq == 60)
    assert equal_lengths.fill is None and equal_lengths.bias is None  # attends on its tokens as they are
