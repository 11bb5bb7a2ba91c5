"""Read back an offline wandb run (`run-*.wandb`) in tests.

wandb ≥ 0.2x writes runs from its Go core and no longer ships a Python reader, so this
decodes the documented container (LevelDB log format: 32 KiB blocks of records with a
7-byte header, after the file's 7-byte `:W&B` header) into `wandb_internal_pb2.Record`s.
"""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path) -> list[pb.Record]:
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a wandb run file")
    out, pos, payload = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        if kind == 0:  # zero padding up to the end of the block
            pos += left - HEADER
            continue
        payload += data[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(payload)
            out.append(record)
            payload = b""
    return out


def finished_records(run_file: Path, timeout: float = 60.0) -> list[pb.Record]:
    """The records of a finished run: wandb's service may still be writing the file when
    `run.finish()` returns (seen on a loaded machine; a short run's file may hold no record
    yet), so read again until its `exit` record is there. raises TimeoutError if it is not there within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (recs := records(run_file)) or recs[-1].WhichOneof("record_type") != "exit":  # none yet: wait too
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run_file} has no exit record after {timeout} s")
        time.sleep(0.2)
    return recs


def history(run_dir: str | Path) -> list[dict]:
    """The logged history rows of the finished offline run in `run_dir` (its `offline-run-*`
    folder). Media entries are dicts, e.g. `row["attention/layer0"]["filenames"]`."""
    (run_file,) = Path(run_dir).glob("run-*.wandb")
    rows = []
    for record in finished_records(run_file):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict = {}
        for item in record.history.item:
            value = json.loads(item.value_json)
            head, *rest = [item.key] if item.key else item.nested_key
            if rest:
                row.setdefault(head, {})[".".join(rest)] = value
            else:
                row[head] = value
        rows.append(row)
    return rows
