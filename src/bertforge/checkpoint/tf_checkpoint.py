"""The original BERT release's TensorFlow checkpoints (google-research/bert, and the BioBERT-era models published
the same way), read without TensorFlow: bert_config.json, vocab.txt and NAME.index + NAME.data-00000-of-00001.

A TensorFlow checkpoint is a table (LevelDB's format) from variable names to where each tensor's bytes are in the
data files, with its dtype and shape (BundleEntryProto, a protocol buffer). The variables carry TensorFlow's names
(bert/encoder/layer_3/attention/self/query/kernel), kernels stored (in, out) where PyTorch keeps (out, in);
`transformers_state_dict` gives them transformers' names and layout, which the rest of the loader knows.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import numpy as np
import torch

from bertforge.errors import CheckpointError

INDEX_SUFFIX = ".index"
TABLE_MAGIC = 0xDB4775248B80FB57  # the last 8 bytes of a LevelDB table
FOOTER_BYTES = 48
BLOCK_TRAILER_BYTES = 5  # after each block: its compression type (1 byte) and checksum (4)
# TensorFlow's DataType enum -> numpy dtype, for the numeric types a checkpoint of weights holds
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64, 10: np.bool_,
          19: np.float16}
BFLOAT16 = 14

# Variables of the optimizer and the training loop, not of the model.
TRAINING_STATE = re.compile(r"(^|/)(adam_[mv]|global_step|good_steps|bad_steps|loss_scale|Momentum)(/|$)")


def find_tf_checkpoint(directory: Path) -> Path | None:
    """The checkpoint prefix in `directory` (model.ckpt-1000000 for model.ckpt-1000000.index): the one TensorFlow's
    `checkpoint` file names, else the only one; None where there is none."""
    named = directory / "checkpoint"
    if named.is_file():
        match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', named.read_text(encoding="utf-8"), re.MULTILINE)
        if match and (directory / (Path(match.group(1)).name + INDEX_SUFFIX)).is_file():
            return directory / Path(match.group(1)).name
    prefixes = sorted(path.with_suffix("") for path in directory.glob("*" + INDEX_SUFFIX))
    if len(prefixes) > 1:
        raise CheckpointError(f"{directory}: several TensorFlow checkpoints ({', '.join(p.name for p in prefixes)}) "
                              f"and no 'checkpoint' file naming one")
    return prefixes[0] if prefixes else None


def read_tf_checkpoint(prefix: Path) -> dict[str, np.ndarray]:
    """Every numeric tensor of the checkpoint PREFIX.index / PREFIX.data-*, by its TensorFlow name."""
    index = prefix.with_name(prefix.name + INDEX_SUFFIX)
    try:
        return _read_tensors(prefix, index)
    except CheckpointError:
        raise  # already names the file and the problem
    # An entry whose fields are not what they should be (bytes where a number belongs, a name not UTF-8)
    except (ValueError, TypeError, IndexError, struct.error) as error:
        raise CheckpointError(f"{index}: unreadable TensorFlow checkpoint entry: {error}") from None


def _read_tensors(prefix: Path, index: Path) -> dict[str, np.ndarray]:
    entries = dict(_table_entries(index.read_bytes(), index))
    header = _fields(entries.pop(b"", b""))
    shards = header.get(1, [1])[0]
    if header.get(2, [0])[0] != 0:
        raise CheckpointError(f"{index}: a big-endian checkpoint, which bertforge does not read")
    data: dict[int, bytes] = {}
    tensors = {}
    for key, value in entries.items():
        name = key.decode("utf-8")
        entry = _fields(value)
        dtype_code = entry.get(1, [0])[0]
        if 7 in entry:
            raise CheckpointError(f"{index}: {name} is stored in slices (a partitioned variable), which bertforge "
                                  f"does not read")
        if dtype_code not in DTYPES and dtype_code != BFLOAT16:
            continue  # strings (the object graph of a TF2 checkpoint) and other non-weights
        shard = entry.get(3, [0])[0]
        if shard not in data:
            path = prefix.with_name(f"{prefix.name}.data-{shard:05d}-of-{shards:05d}")
            try:
                data[shard] = path.read_bytes()
            except OSError as error:
                raise CheckpointError(f"{path}: can't read the checkpoint's data: {error.strerror or error}") from None
        shape = [_fields(dim).get(1, [0])[0] for dim in _fields(entry[2][0]).get(2, [])] if 2 in entry else []
        offset, size = entry.get(4, [0])[0], entry.get(5, [0])[0]
        raw = data[shard][offset:offset + size]
        if len(raw) != size:
            raise CheckpointError(f"{index}: {name} lies past the end of its data file (truncated download?)")
        if dtype_code == BFLOAT16:  # numpy has no bfloat16: widen the 16 bits to float32's upper half
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=np.dtype(DTYPES[dtype_code]).newbyteorder("<"))
        if array.size != math.prod(shape):  # Python's integers: numpy's product of huge sizes wraps to 0
            raise CheckpointError(f"{index}: {name} holds {array.size} numbers for its shape {shape}")
        tensors[name] = array.reshape(shape)
    return tensors


def transformers_state_dict(tensors: dict[str, np.ndarray], source: Path) -> dict[str, torch.Tensor]:
    """The model's tensors under transformers' names and in PyTorch's layout; the optimizer's and the training
    loop's variables are left out, and a name this mapping doesn't know is an error naming it."""
    state = {}
    for name, array in tensors.items():
        if TRAINING_STATE.search(name):
            continue
        hf_name, transpose = _transformers_name(name)
        if hf_name is None:
            raise CheckpointError(f"{source}: variable {name!r} is not one of BERT's (bertforge reads the original "
                                  f"BERT release's names)")
        tensor = torch.from_numpy(np.array(array))
        state[hf_name] = tensor.t().contiguous() if transpose else tensor
    return state


def _transformers_name(name: str) -> tuple[str | None, bool]:
    """A TensorFlow variable name -> (transformers' name, whether the matrix is stored transposed)."""
    # Heads of the release's scripts: run_classifier.py's output layer, run_squad.py's span layer.
    heads = {"output_weights": "classifier.weight", "output_bias": "classifier.bias",
             "cls/squad/output_weights": "qa_outputs.weight", "cls/squad/output_bias": "qa_outputs.bias",
             "cls/predictions/output_bias": "cls.predictions.bias",
             "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
             "cls/seq_relationship/output_bias": "cls.seq_relationship.bias"}
    if name in heads:
        return heads[name], False
    parts = name.split("/")
    if parts[0] not in ("bert", "cls"):
        return None, False
    renamed, transpose = [], False
    for part in parts:
        layer = re.fullmatch(r"layer_(\d+)", part)
        if layer:
            renamed += ["layer", layer.group(1)]
        elif part == "kernel":
            renamed.append("weight")
            transpose = True
        elif part == "gamma":
            renamed.append("weight")
        elif part == "beta":
            renamed.append("bias")
        elif part in ("word_embeddings", "position_embeddings", "token_type_embeddings") and parts[-1] == part:
            renamed += [part, "weight"]
        else:
            renamed.append(part)
    return ".".join(renamed), transpose


# ---------------------------------------------------------------- LevelDB tables and protocol buffers

def _varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(data):
            raise ValueError("a number runs past the end of the data")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _fields(message: bytes) -> dict[int, list]:
    """A protocol buffer's fields by number: integers for varints and fixed-width fields, bytes for the rest."""
    fields: dict[int, list] = {}
    position = 0
    while position < len(message):
        key, position = _varint(message, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(message, position)
        elif wire == 1:
            value, position = struct.unpack_from("<Q", message, position)[0], position + 8
        elif wire == 2:
            length, position = _varint(message, position)
            value, position = message[position:position + length], position + length
        elif wire == 5:
            value, position = struct.unpack_from("<I", message, position)[0], position + 4
        else:
            raise ValueError(f"unknown protocol buffer wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


def _block(table: bytes, handle: bytes, source: Path) -> bytes:
    offset, position = _varint(handle, 0)
    size, _ = _varint(handle, position)
    if offset + size + BLOCK_TRAILER_BYTES > len(table):
        raise CheckpointError(f"{source}: a block lies past the end of the file (truncated download?)")
    if table[offset + size] != 0:
        raise CheckpointError(f"{source}: compressed blocks (type {table[offset + size]}), which bertforge does not "
                              f"read")
    return table[offset:offset + size]


def _block_entries(block: bytes):
    """(key, value) pairs of a table block: keys share a prefix with the key before them."""
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end, position, key = len(block) - 4 - 4 * restarts, 0, b""
    while position < end:
        shared, position = _varint(block, position)
        unshared, position = _varint(block, position)
        length, position = _varint(block, position)
        key = key[:shared] + block[position:position + unshared]
        position += unshared
        yield key, block[position:position + length]
        position += length


def _table_entries(table: bytes, source: Path):
    """(key, value) pairs of a LevelDB table file: the index block names each data block."""
    try:
        if len(table) < FOOTER_BYTES or struct.unpack_from("<Q", table, len(table) - 8)[0] != TABLE_MAGIC:
            raise CheckpointError(f"{source}: not a TensorFlow checkpoint index")
        footer = table[len(table) - FOOTER_BYTES:]
        _, position = _varint(footer, 0)  # the metaindex block's handle: nothing in it is needed
        _, position = _varint(footer, position)
        index = _block(table, footer[position:], source)
        for _, handle in _block_entries(index):
            yield from _block_entries(_block(table, handle, source))
    except CheckpointError:
        raise  # already names the file and the problem
    except (ValueError, struct.error, IndexError) as error:
        raise CheckpointError(f"{source}: unreadable TensorFlow checkpoint index: {error}") from None
