"""Building embedded models once under concurrent processes: rank 0 writes, the other ranks wait for its copy (since
transformers' save_pretrained writes nothing on them once a process group exists)."""

import threading
import time

import pytest

from app.tiny import cache


def _write(folder):
    (folder / "weights.bin").write_text("w")
    (folder / "done").write_text("")


def test_first_process_builds_and_the_folder_is_complete(tmp_path):
    target = cache.build_once(tmp_path / "model", "done", _write)
    assert sorted(p.name for p in target.iterdir()) == ["done", "weights.bin"]
    assert cache.build_once(target, "done", lambda folder: pytest.fail("built twice")) == target


def test_other_ranks_wait_for_rank_zeros_copy_instead_of_building(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "_is_nonzero_rank", lambda: True)
    target = tmp_path / "model"

    def rank_zero():
        time.sleep(0.5)
        target.mkdir()
        _write(target)

    thread = threading.Thread(target=rank_zero)
    thread.start()
    got = cache.build_once(target, "done", lambda folder: pytest.fail("a rank > 0 must not build"))
    thread.join()
    assert got == target and (target / "weights.bin").read_text() == "w"


def test_a_rank_waiting_in_vain_says_what_it_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "_is_nonzero_rank", lambda: True)
    with pytest.raises(TimeoutError, match="for rank 0 to build the embedded model model"):
        cache._wait_for(tmp_path / "model", "done", timeout_s=0.3)
