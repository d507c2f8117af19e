"""The files directory on its own: caps, retention, ids that cannot be paths."""
import io
import json

import pytest

from inferq.producer.gateway.files_store import FilesStore, FileTooLarge, valid_id


def test_save_get_delete_and_retention(tmp_path):
    store = FilesStore(tmp_path / "files", max_bytes=100)
    old = store.save_stream(io.BytesIO(b'{"a": 1}\n'), "old.jsonl", "batch", "team-a")
    new = store.save_stream(io.BytesIO(b'{"b": 2}\n'), "new.jsonl", "batch", None)
    assert store.get(old["id"])["bytes"] == 9 and store.get(old["id"])["tenant"] == "team-a"
    assert store.data_path(old["id"]).read_bytes() == b'{"a": 1}\n'
    # Backdate one file by two days: a one-day retention removes it (data and record), not the other.
    meta_path = store.root / f"{old['id']}.json"
    meta = json.loads(meta_path.read_text())
    meta["created_at"] -= 2 * 86_400
    meta_path.write_text(json.dumps(meta))
    assert store.expire(86_400) == 1
    assert store.get(old["id"]) is None and not store.data_path(old["id"]).exists()
    assert store.get(new["id"]) is not None
    assert store.delete(new["id"]) and not store.delete(new["id"])
    assert list(store.all()) == []


def test_size_cap_keeps_nothing(tmp_path):
    store = FilesStore(tmp_path, max_bytes=10)
    with pytest.raises(FileTooLarge):
        store.save_stream(io.BytesIO(b"x" * 11), "big.jsonl", "batch", None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["../etc/passwd", "file-../../x", "file-a/b", "batch_x", "file-" + "a" * 200, ""])
def test_ids_that_are_not_ours_are_refused(tmp_path, bad):
    store = FilesStore(tmp_path, max_bytes=10)
    assert not valid_id(bad) and store.get(bad) is None and not store.delete(bad)
