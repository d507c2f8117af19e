"""host_upload.Upload: many small arrays, one buffer, typed views on the device."""
from __future__ import annotations

import torch

from inferq.gpuworker.engine.host_upload import Upload


def test_the_upload_packs_every_array_into_one_buffer_and_cuts_typed_views():
    up = Upload(torch.device("cpu"))
    ints = up.add([3, -1, 2**40], torch.int64)
    floats = up.add([0.7, 1e-5, 2.0], torch.float32)  # 12 bytes: the next array starts 8-byte aligned
    flags = up.add([True, False, True, True, False], torch.bool)
    empty = up.add([], torch.int64)
    moves = []
    up._send_packed(lambda buf: moves.append(buf) or buf.clone())
    assert len(moves) == 1 and moves[0].dtype == torch.int64
    assert ints.t.tolist() == [3, -1, 2**40] and ints.t.dtype == torch.int64
    assert torch.equal(floats.t, torch.tensor([0.7, 1e-5, 2.0], dtype=torch.float32))
    assert flags.t.tolist() == [True, False, True, True, False] and flags.t.dtype == torch.bool
    assert empty.t.numel() == 0 and empty.t.dtype == torch.int64
